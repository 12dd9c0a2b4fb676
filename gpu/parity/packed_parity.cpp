#include "gpu/parity/packed_parity.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "core/half.h"
#include "core/packed_kv.h"
#include "core/rope.h"
#include "gpu/packed_attention_ref.h"
#include "gpu/parity/nmse.h"
#include "gpu/transformer_kernels_ref.h"
#include "gpu/packed_attention.cuh"
#include "gpu/packed_rows.h"
#include "gpu/packed_unpack.cuh"
#include "gpu/parity/parity_buffers.h"
#include "gpu/parity/random_packed.h"
#include "gpu/transformer_kernels.cuh"
#include "gpu/transformer_shape.h"

namespace kvsim::gpu {

namespace {

// A PackedTensor's arrays on the device, and the view the kernels read them through.
struct DevicePacked {
  RowTable table;
  DeviceBuffer<RowRun> runs;
  DeviceBuffer<std::int32_t> positions;
  DeviceBuffer<std::uint16_t> halves, params, basis;
  DeviceBuffer<std::uint8_t> codes;
  PackedTensorView view;
  DevicePacked(const PackedTensor& t, int head_dim)
      : table(row_table(t, head_dim)),
        runs(table.runs),
        positions(table.positions),
        halves(t.halves),
        params(t.params),
        basis(t.basis),
        codes(t.codes) {
    view = layout_view(t, table);
    view.runs = runs.ptr;
    view.positions = table.positions.empty() ? nullptr : positions.ptr;
    view.halves = halves.ptr;
    view.codes = codes.ptr;
    view.params = params.ptr;
    view.basis = basis.ptr;
  }
};

// n rows of random intN codes with per-token groups (scales in [0.01, 0.2], mins in [-1, 0]):
// what intn:bits=... stores, made without quantizing anything (the bench caches are large).
PackedTensor random_quant_tensor(const QuantSpec& q, int d, std::int64_t n, std::uint64_t seed) {
  PackedTensor t;
  t.bits = q.bits, t.param_span = q.group, t.symmetric = q.symmetric;
  const int rb = q.row_bytes(d), ng = q.groups(d);
  std::uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  auto next = [&x] {  // xorshift64: fast enough for hundreds of MB
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return x;
  };
  t.codes.resize(static_cast<std::size_t>(n * rb));
  for (auto& c : t.codes) c = static_cast<std::uint8_t>(next() >> 56);
  t.params.resize(static_cast<std::size_t>(n * ng * 2));
  for (std::size_t i = 0; i < t.params.size(); i += 2) {
    const double u = static_cast<double>(next() >> 11) / 9007199254740992.0,
                 v = static_cast<double>(next() >> 11) / 9007199254740992.0;
    t.params[i] = float_to_half(static_cast<float>(0.01 + 0.19 * u));
    t.params[i + 1] = float_to_half(q.symmetric ? 0.0f : static_cast<float>(-v));
  }
  t.rows.resize(static_cast<std::size_t>(n));
  for (std::int64_t m = 0; m < n; ++m) {
    PackedRow& r = t.rows[static_cast<std::size_t>(m)];
    r.kind = PackedKind::Quant;
    r.position = static_cast<std::int32_t>(m);
    r.data = m * rb;
    r.param = m * ng;
  }
  return t;
}

double payload_bytes(const PackedTensor& t, const RowTable& table) {
  return 2.0 * static_cast<double>(t.halves.size() + t.params.size()) + static_cast<double>(t.codes.size()) +
         static_cast<double>(table.bytes());
}

std::vector<float> floats_of(const std::vector<std::uint16_t>& h) {
  std::vector<float> f(h.size());
  halves_to_floats(h.data(), f.data(), h.size());
  return f;
}

constexpr float kRopeTheta = 10000.0f;

// attend_decode_packed over s.capacity rows per entry against attend_kept_ref over the rows
// unpack_tensor reads back: entry 0 fully packed, the last entry (of several) in fp16 only, the
// rest a packed prefix of different lengths with fp16 rows after it (int4 keys with rotated low
// rank rows, int2 absmax values). Query head h reads entry h / s.group().
void mixed_rows_decode(const AttnShape& s, const std::string& label, ParityReport& r) {
  const int d = s.head_dim, Hq = s.n_q_heads, Hkv = s.n_kv_heads;
  const std::int64_t n = s.capacity;
  const auto un = static_cast<std::size_t>(n);
  std::mt19937 rng(31);
  std::vector<float> cos_t, sin_t;
  rope_tables(RopeSpec{RopeType::Neox, d, d, kRopeTheta}, n, cos_t, sin_t);
  DeviceBuffer<float> dcos(cos_t), dsin(sin_t);
  const std::vector<float> q = gaussian(static_cast<std::size_t>(Hq * d), rng);
  const MixedPackedCache cache = random_mixed_cache(Hkv, d, n, RopeType::Neox, rng);
  std::vector<std::unique_ptr<DevicePacked>> held;
  std::vector<PackedEntryView> views(static_cast<std::size_t>(Hkv));
  for (std::size_t e = 0; e < views.size(); ++e)
    for (const bool keys : {true, false}) {
      const PackedTensor& t = keys ? cache.keys[e] : cache.values[e];
      if (t.rows.empty()) continue;
      held.push_back(std::make_unique<DevicePacked>(t, d));
      (keys ? views[e].k : views[e].v) = held.back()->view;
    }
  const std::vector<std::int32_t> kept = every_row_kept(Hkv, static_cast<int>(n)),
                                  counts(static_cast<std::size_t>(Hkv), static_cast<std::int32_t>(n));
  std::vector<float> out_ref(static_cast<std::size_t>(Hq * d)), w_ref(static_cast<std::size_t>(Hq) * un);
  attend_kept_ref(s, q.data(), cache.dense_k.data(), cache.dense_v.data(), kept.data(), counts.data(),
                  static_cast<int>(n), out_ref.data(), w_ref.data());
  const EntryRows seen = same_rows(Hkv, static_cast<int>(n));
  DeviceBuffer<float> dq(q), dout(out_ref.size()), dscratch(decode_scratch_floats(Hq, d)), dprobs(w_ref.size()),
      dstats(static_cast<std::size_t>(2 * Hq));
  DeviceBuffer<PackedEntryView> dviews(views);
  DeviceBuffer<std::uint16_t> dtk(cache.tail_k), dtv(cache.tail_v);
  KVSIM_CUDA_CHECK(attend_decode_packed(dq.ptr, Hq, d, s.group(), dviews.ptr, RopeShape{true, d}, dcos.ptr, dsin.ptr,
                                        dtk.ptr, dtv.ptr, cache.tail, seen, 1.0f / std::sqrt(static_cast<float>(d)),
                                        dscratch.ptr, dscratch.n, dout.ptr, false, dprobs.ptr, static_cast<int>(n),
                                        dstats.ptr, nullptr));
  r.value(label + ": output", nmse(dout.host(), out_ref), kKernelNmse);
  r.value(label + ": weights", nmse(dprobs.host(), w_ref), kKernelNmse);
}

// An int4 cache (per-token groups of 32, min-max: intn:bits=4) decoded three ways, each against
// the copy bandwidth: the fused kernel (also against attend_quant_ref), unpack then attend, and
// the same rows as an fp16 cache through attend_decode. The cache holds at least 128 MB packed:
// an H200's L2 is 50 MB, and a smaller cache would be read from L2 on the repeated calls.
void int4_decode_bench(const AttnShape& shape, const Bench& bench, ParityReport& r, double copy_gbs) {
  const int d = shape.head_dim, Hq = shape.n_q_heads, Hkv = shape.n_kv_heads;
  const QuantSpec spec4{4, 32, false};
  const std::int64_t token_bytes = 2LL * Hkv * (spec4.row_bytes(d) + 4LL * spec4.groups(d));
  const std::int64_t n =
      bench.size(std::max<std::int64_t>(shape.capacity, (128'000'000 + token_bytes - 1) / token_bytes), shape.capacity);
  const AttnShape s{Hq, Hkv, d, n};
  const auto ud = static_cast<std::size_t>(d), un = static_cast<std::size_t>(n);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  std::mt19937 rng(37);
  const RopeShape rope{true, d};  // no row is rotated: the tables are never read
  const std::vector<float> q = gaussian(static_cast<std::size_t>(Hq * d), rng);
  std::vector<std::unique_ptr<DevicePacked>> held;
  std::vector<PackedEntryView> views(static_cast<std::size_t>(Hkv));
  std::vector<std::uint8_t> all_kc, all_vc;
  std::vector<std::uint16_t> all_kp, all_vp, fp16_kh, fp16_vh;  // fp16_*: the same rows as an fp16 cache
  std::vector<float> rows(un * ud);
  double bytes = 0;
  for (int e = 0; e < Hkv; ++e) {
    const auto ue = static_cast<std::size_t>(e);
    for (const bool keys : {true, false}) {
      const PackedTensor t = random_quant_tensor(spec4, d, n, 2 * ue + (keys ? 1 : 2));
      auto& codes = keys ? all_kc : all_vc;
      auto& params = keys ? all_kp : all_vp;
      codes.insert(codes.end(), t.codes.begin(), t.codes.end());
      params.insert(params.end(), t.params.begin(), t.params.end());
      unpack_int_rows(spec4, d, t.codes.data(), t.params.data(), n, rows.data());
      auto& dense = keys ? fp16_kh : fp16_vh;
      dense.resize(dense.size() + rows.size());
      floats_to_halves(rows.data(), dense.data() + dense.size() - rows.size(), rows.size());
      held.push_back(std::make_unique<DevicePacked>(t, d));
      bytes += payload_bytes(t, held.back()->table);
      (keys ? views[ue].k : views[ue].v) = held.back()->view;
    }
  }
  r.line("  int4 bench cache: " + std::to_string(n) + " tokens per KV head");
  const std::vector<std::int32_t> counts(static_cast<std::size_t>(Hkv), static_cast<std::int32_t>(n));
  std::vector<float> out_ref(static_cast<std::size_t>(Hq * d));
  attend_quant_ref(s, spec4, q.data(), all_kc.data(), all_kp.data(), all_vc.data(), all_vp.data(), counts.data(),
                   out_ref.data());
  const EntryRows seen = same_rows(Hkv, static_cast<int>(n));
  DeviceBuffer<float> dq(q), dout(out_ref.size()), dscratch(decode_scratch_floats(Hq, d));
  DeviceBuffer<PackedEntryView> dviews(views);
  DeviceBuffer<std::uint16_t> none(std::size_t{1});
  auto fused = [&] {
    KVSIM_CUDA_CHECK(attend_decode_packed(dq.ptr, Hq, d, s.group(), dviews.ptr, rope, nullptr, nullptr, none.ptr,
                                          none.ptr, 0, seen, scale, dscratch.ptr, dscratch.n, dout.ptr, false, nullptr,
                                          0, nullptr, nullptr));
  };
  fused();
  r.value("fused packed decode, int4 cache: output", nmse(dout.host(), out_ref), kKernelNmse);
  DeviceBuffer<std::uint16_t> unpacked_k(fp16_kh.size()), unpacked_v(fp16_kh.size());
  auto unpack_then_attend = [&] {
    for (std::size_t e = 0; e < views.size(); ++e) {
      KVSIM_CUDA_CHECK(unpack_packed(views[e].k, d, rope, nullptr, nullptr, unpacked_k.ptr + e * un * ud, nullptr));
      KVSIM_CUDA_CHECK(unpack_packed(views[e].v, d, rope, nullptr, nullptr, unpacked_v.ptr + e * un * ud, nullptr));
    }
    KVSIM_CUDA_CHECK(attend_decode(dq.ptr, Hq, d, s.group(), unpacked_k.ptr, unpacked_v.ptr, n, seen, 0, scale,
                                   dscratch.ptr, dscratch.n, dout.ptr, false, nullptr));
  };
  unpack_then_attend();
  r.value("unpack then attend, int4 cache: output", nmse(dout.host(), out_ref), kKernelNmse);
  DeviceBuffer<std::uint16_t> fp16_k(fp16_kh), fp16_v(fp16_vh);
  auto fp16_decode = [&] {
    KVSIM_CUDA_CHECK(attend_decode(dq.ptr, Hq, d, s.group(), fp16_k.ptr, fp16_v.ptr, n, seen, 0, scale, dscratch.ptr,
                                   dscratch.n, dout.ptr, false, nullptr));
  };
  fp16_decode();
  r.value("fp16 cache decode of the same rows: output", nmse(dout.host(), out_ref), kKernelNmse);
  const double t_fused = seconds_of(fused, bench.reps(10)), t_unpack = seconds_of(unpack_then_attend, bench.reps(10)),
               t_fp16 = seconds_of(fp16_decode, bench.reps(10));
  const double fp16_bytes = 2.0 * 2.0 * Hkv * static_cast<double>(n) * d;
  char buf[320];
  std::snprintf(
      buf, sizeof buf,
      "  bench fused packed decode (int4 g32): %.1f us, %.1f GB/s of packed rows and tables = %.2f of copy bandwidth",
      t_fused * 1e6, bytes / t_fused / 1e9, bytes / t_fused / 1e9 / copy_gbs);
  r.line(buf);
  std::snprintf(buf, sizeof buf,
                "  bench unpack then attend (the same cache): %.1f us: the fused decode is %.2fx faster",
                t_unpack * 1e6, t_unpack / t_fused);
  r.line(buf);
  std::snprintf(buf, sizeof buf,
                "  bench fp16 cache decode (the same rows, %.0f MB vs %.0f MB packed): %.1f us, %.1f GB/s = %.2f of "
                "copy bandwidth; "
                "fused int4 / fp16 time %.2f",
                fp16_bytes / 1e6, bytes / 1e6, t_fp16 * 1e6, fp16_bytes / t_fp16 / 1e9,
                fp16_bytes / t_fp16 / 1e9 / copy_gbs, t_fused / t_fp16);
  r.line(buf);
}

}  // namespace

void packed_unpack_parity(const std::string& name, int d, std::int64_t n, const Bench& bench, ParityReport& r,
                          double copy_gbs) {
  std::mt19937 rng(7);
  const RopeSpec spec{RopeType::Neox, d, d, kRopeTheta};
  const RopeShape rope{true, d};
  std::vector<float> cos_t, sin_t;
  rope_tables(spec, n, cos_t, sin_t);
  DeviceBuffer<float> dcos(cos_t), dsin(sin_t);
  struct Case {
    const char* label;
    int bits, span;
    bool symmetric, rotate;
  };
  for (const Case c : {Case{"keys: int4 g32 min-max, rotated low rank", 4, 32, false, true},
                       Case{"values: int2 g16 absmax, low rank", 2, 16, true, false}}) {
    const PackedTensor t = random_packed(d, n, c.bits, c.span, c.symmetric, c.rotate, rng);
    std::vector<float> ref;
    unpack_tensor(t, d, spec, ref);
    const DevicePacked dt(t, d);
    DeviceBuffer<std::uint16_t> dout(t.rows.size() * static_cast<std::size_t>(d));
    KVSIM_CUDA_CHECK(unpack_packed(dt.view, d, rope, dcos.ptr, dsin.ptr, dout.ptr, nullptr));
    r.value(name + " packed unpack, " + c.label, nmse(floats_of(dout.host()), ref), kKernelNmse);
    if (bench) {
      const double sec =
          seconds_of([&] { KVSIM_CUDA_CHECK(unpack_packed(dt.view, d, rope, dcos.ptr, dsin.ptr, dout.ptr, nullptr)); },
                     bench.reps(20));
      // Bytes moved: the packed payload and row table read, the fp16 rows written (bases cached).
      const double bytes = payload_bytes(t, dt.table) + 2.0 * static_cast<double>(dout.n);
      char buf[200];
      std::snprintf(buf, sizeof buf, "  bench packed unpack (%s): %.1f us, %.1f GB/s = %.2f of copy bandwidth", c.label,
                    sec * 1e6, bytes / sec / 1e9, bytes / sec / 1e9 / copy_gbs);
      r.line(buf);
    }
  }
}

void packed_decode_parity(const std::string& name, const AttnShape& s, const Bench& bench, ParityReport& r,
                          double copy_gbs) {
  r.line(name + ": " + std::to_string(s.n_q_heads) + " query heads, " + std::to_string(s.n_kv_heads) +
         " KV heads, head_dim " + std::to_string(s.head_dim) + ", " + std::to_string(s.capacity) + " rows per entry");
  mixed_rows_decode(s, "fused packed decode, mixed rows", r);
  // Per-query-head entries (one per query head, as a per-query-head plan leaves them): head_div 1.
  mixed_rows_decode(AttnShape{s.n_q_heads, s.n_q_heads, s.head_dim, std::max<std::int64_t>(s.capacity / 4, 1)},
                    "fused packed decode, per-query-head entries", r);
  if (bench) int4_decode_bench(s, bench, r, copy_gbs);
}

}  // namespace kvsim::gpu
