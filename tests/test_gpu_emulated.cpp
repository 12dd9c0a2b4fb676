// The project's CUDA kernels (gpu/*.cu), run on the CPU by tests/cuda_emu, against their CPU
// references: on a machine without a GPU this is where the kernels' indexing, launch
// configurations and barriers are exercised at all (the device check, bench/gpu_check.sh, holds
// them to the same references on a GPU). Problems are small: the emulator switches threads in
// software.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
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
#include "gpu/parity/parity_report.h"
#include "gpu/parity/parity_shapes.h"
#include "gpu/policy_step.cuh"
#include "gpu/parity/random_inputs.h"
#include "gpu/parity/random_packed.h"
#include "gpu/transformer_kernels.cuh"
#include "gpu/parity/transformer_parity.h"
#include "gpu/transformer_shape.h"

using namespace kvsim;
using namespace kvsim::gpu;

namespace {

// The fused decode's view of a mixed cache's host arrays (the emulator's device memory is host memory).
struct HostViews {
  std::vector<RowTable> tables;
  std::vector<PackedEntryView> views;
  HostViews(const MixedPackedCache& c, int head_dim) : views(c.keys.size()) {
    tables.reserve(2 * c.keys.size());  // the views point into them
    for (std::size_t e = 0; e < c.keys.size(); ++e)
      for (const bool keys : {true, false}) {
        const PackedTensor& t = keys ? c.keys[e] : c.values[e];
        if (t.rows.empty()) continue;
        tables.push_back(row_table(t, head_dim));
        (keys ? views[e].k : views[e].v) = host_view(t, tables.back());
      }
  }
  HostViews(const HostViews&) = delete;  // the views point into this object's tables
  HostViews& operator=(const HostViews&) = delete;
};

}  // namespace

TEST_CASE("emulated: the fused packed decode attends over what unpack_tensor reads back", "[gpu-emu]") {
  struct Case {
    int n_q_heads, entries, d;
    RopeType pairing;
  };
  // GQA (query head h reads entry h / group: groups of 3, 2 and 7, the last two blocks a group:
  // tiles of 4 and 3), per-query-head entries (head_div 1), two head sizes, both RoPE pairings;
  // 300 rows split three ways by the decode.
  for (const Case c : {Case{6, 2, 32, RopeType::Neox}, Case{6, 6, 32, RopeType::Norm}, Case{4, 2, 64, RopeType::Norm},
                       Case{14, 2, 32, RopeType::Neox}}) {
    INFO("query heads " << c.n_q_heads << ", entries " << c.entries << ", head_dim " << c.d);
    std::mt19937 rng(3);
    const int n = 300, d = c.d, Hq = c.n_q_heads;
    const RopeSpec spec{c.pairing, d, d, 10000.0};
    std::vector<float> cos_t, sin_t;
    rope_tables(spec, n, cos_t, sin_t);
    const MixedPackedCache cache = random_mixed_cache(c.entries, d, n, c.pairing, rng);
    const HostViews host(cache, d);
    const std::vector<float> q = gaussian(static_cast<std::size_t>(Hq * d), rng);
    const AttnShape shape{Hq, c.entries, d, n};
    std::vector<float> out_ref(static_cast<std::size_t>(Hq * d)), w_ref(static_cast<std::size_t>(Hq * n));
    const auto kept = every_row_kept(c.entries, n);
    const std::vector<std::int32_t> counts(static_cast<std::size_t>(c.entries), n);
    attend_kept_ref(shape, q.data(), cache.dense_k.data(), cache.dense_v.data(), kept.data(), counts.data(), n,
                    out_ref.data(), w_ref.data());
    std::vector<float> scratch(decode_scratch_floats(Hq, d)), out(out_ref.size()), probs(w_ref.size(), -1.0f),
        stats(2 * Hq);
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    const RopeShape rope{c.pairing == RopeType::Neox, d};
    REQUIRE(attend_decode_packed(q.data(), Hq, d, shape.group(), host.views.data(), rope, cos_t.data(), sin_t.data(),
                                 cache.tail_k.data(), cache.tail_v.data(), cache.tail, same_rows(c.entries, n), scale,
                                 scratch.data(), scratch.size(), out.data(), false, probs.data(), n, stats.data(),
                                 nullptr) == cudaSuccess);
    CHECK(nmse(out, out_ref) < 1e-10);
    CHECK(nmse(probs, w_ref) < 1e-10);
    // The unpack path over the same cache: unpack_packed per entry, then the fp16 split decode.
    std::vector<std::uint16_t> unpacked_k(cache.dense_k.size()), unpacked_v(cache.dense_v.size());
    for (int e = 0; e < c.entries; ++e) {
      const auto off = static_cast<std::size_t>(e) * n * d;
      const PackedEntryView& v = host.views[static_cast<std::size_t>(e)];
      REQUIRE(unpack_packed(v.k, d, rope, cos_t.data(), sin_t.data(), unpacked_k.data() + off, nullptr) == cudaSuccess);
      REQUIRE(unpack_packed(v.v, d, rope, cos_t.data(), sin_t.data(), unpacked_v.data() + off, nullptr) == cudaSuccess);
      const auto p = static_cast<std::size_t>(v.k.n_rows);
      const auto tail_at = static_cast<std::size_t>(e) * static_cast<std::size_t>(cache.tail) * d;
      std::copy_n(cache.tail_k.begin() + static_cast<std::ptrdiff_t>(tail_at), (n - p) * d,
                  unpacked_k.begin() + static_cast<std::ptrdiff_t>(off + p * d));
      std::copy_n(cache.tail_v.begin() + static_cast<std::ptrdiff_t>(tail_at), (n - p) * d,
                  unpacked_v.begin() + static_cast<std::ptrdiff_t>(off + p * d));
    }
    // The emulator's arithmetic is the host's: unpacking gives unpack_tensor's rows to the bit.
    CHECK(unpacked_k == cache.dense_k);
    CHECK(unpacked_v == cache.dense_v);
    std::vector<float> out_unpack(out.size());
    REQUIRE(attend_decode(q.data(), Hq, d, shape.group(), unpacked_k.data(), unpacked_v.data(), n,
                          same_rows(c.entries, n), 0, scale, scratch.data(), scratch.size(), out_unpack.data(), false,
                          nullptr) == cudaSuccess);
    CHECK(nmse(out_unpack, out_ref) < 1e-10);
    std::vector<float> last(w_ref.size(), -1.0f);
    REQUIRE(last_row_weights(q.data(), Hq, d, shape.group(), unpacked_k.data(), n, same_rows(c.entries, n), 0, scale,
                             last.data(), n, nullptr) == cudaSuccess);
    CHECK(nmse(last, w_ref) < 1e-10);
  }
}

TEST_CASE("emulated: prefill attention over past rows and the new rows, causally", "[gpu-emu]") {
  std::mt19937 rng(8);
  const int Hq = 4, entries = 2, d = 64, past = 40, n = 20, cap = past + n;
  std::vector<float> kf = gaussian(static_cast<std::size_t>(entries * cap * d), rng), vf = gaussian(kf.size(), rng);
  const auto k = halves(kf), v = halves(vf);
  const std::vector<float> q = gaussian(static_cast<std::size_t>(n * Hq * d), rng);
  std::vector<float> out(q.size());
  REQUIRE(attend_rows(q.data(), n, Hq, d, Hq / entries, k.data(), v.data(), cap, same_rows(entries, past), 0,
                      1.0f / std::sqrt(static_cast<float>(d)), out.data(), false, nullptr) == cudaSuccess);
  // Row i sees the entry's rows [0, past + i]: the reference keeps exactly those.
  std::vector<float> want(q.size());
  for (int i = 0; i < n; ++i) {
    const int seen = past + i + 1;
    const std::vector<std::int32_t> kept = every_row_kept(entries, seen);
    const std::vector<std::int32_t> counts(static_cast<std::size_t>(entries), seen);
    const std::vector<float> qi(q.begin() + static_cast<std::ptrdiff_t>(i * Hq * d),
                                q.begin() + static_cast<std::ptrdiff_t>((i + 1) * Hq * d));
    attend_kept_ref(AttnShape{Hq, entries, d, cap}, qi.data(), k.data(), v.data(), kept.data(), counts.data(), seen,
                    want.data() + static_cast<std::ptrdiff_t>(i * Hq * d), nullptr);
  }
  CHECK(nmse(out, want) < 1e-10);
}

// kept[e * width + m]: the rows [lo_e, seen_e) of each entry, for attend_kept_ref.
std::vector<std::int32_t> window_rows(const std::vector<int>& seen, int window, int width,
                                      std::vector<std::int32_t>& counts) {
  std::vector<std::int32_t> kept(seen.size() * static_cast<std::size_t>(width), 0);
  counts.assign(seen.size(), 0);
  for (std::size_t e = 0; e < seen.size(); ++e) {
    const auto lo = static_cast<int>(window_start(window, seen[e]));
    counts[e] = seen[e] - lo;
    for (int j = lo; j < seen[e]; ++j) kept[e * static_cast<std::size_t>(width) + static_cast<std::size_t>(j - lo)] = j;
  }
  return kept;
}

TEST_CASE("emulated: prefill attention over a sliding window sees each row's last `window` keys", "[gpu-emu]") {
  std::mt19937 rng(18);
  const int Hq = 4, entries = 2, d = 64, past = 40, n = 20, cap = past + n;
  std::vector<float> kf = gaussian(static_cast<std::size_t>(entries * cap * d), rng), vf = gaussian(kf.size(), rng);
  const auto k = halves(kf), v = halves(vf);
  const std::vector<float> q = gaussian(static_cast<std::size_t>(n * Hq * d), rng);
  for (const int window : {13, 33, 200}) {  // inside a tile, across tiles, wider than everything
    INFO("window " << window);
    std::vector<float> out(q.size());
    REQUIRE(attend_rows(q.data(), n, Hq, d, Hq / entries, k.data(), v.data(), cap, same_rows(entries, past), window,
                        1.0f / std::sqrt(static_cast<float>(d)), out.data(), false, nullptr) == cudaSuccess);
    std::vector<float> want(q.size());
    for (int i = 0; i < n; ++i) {
      std::vector<std::int32_t> counts;
      const std::vector<std::int32_t> kept = window_rows(std::vector<int>(entries, past + i + 1), window, cap, counts);
      const std::vector<float> qi(q.begin() + static_cast<std::ptrdiff_t>(i * Hq * d),
                                  q.begin() + static_cast<std::ptrdiff_t>((i + 1) * Hq * d));
      attend_kept_ref(AttnShape{Hq, entries, d, cap}, qi.data(), k.data(), v.data(), kept.data(), counts.data(), cap,
                      want.data() + static_cast<std::ptrdiff_t>(i * Hq * d), nullptr);
    }
    CHECK(nmse(out, want) < 1e-10);
  }
}

TEST_CASE("emulated: split decode and last-row weights over a sliding window of a long entry", "[gpu-emu]") {
  std::mt19937 rng(28);
  const int Hq = 4, entries = 2, d = 64, cap = 700, window = 300;
  const std::vector<int> seen = {700, 651};  // entries of different lengths: each its own window start
  std::vector<float> kf = gaussian(static_cast<std::size_t>(entries * cap * d), rng), vf = gaussian(kf.size(), rng);
  const auto k = halves(kf), v = halves(vf);
  const std::vector<float> q = gaussian(static_cast<std::size_t>(Hq * d), rng);
  EntryRows rows;
  rows.count = entries;
  for (int e = 0; e < entries; ++e) rows.rows[e] = seen[static_cast<std::size_t>(e)];
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  REQUIRE(decode_split(decode_block_rows(Hq, Hq / entries), window_span(rows, window)).splits > 1);
  std::vector<float> scratch(decode_scratch_floats(Hq, d)), out(q.size()), w(static_cast<std::size_t>(Hq * cap), -1.0f);
  REQUIRE(attend_decode(q.data(), Hq, d, Hq / entries, k.data(), v.data(), cap, rows, window, scale, scratch.data(),
                        scratch.size(), out.data(), false, nullptr) == cudaSuccess);
  REQUIRE(last_row_weights(q.data(), Hq, d, Hq / entries, k.data(), cap, rows, window, scale, w.data(), cap, nullptr) ==
          cudaSuccess);
  std::vector<std::int32_t> counts;
  const std::vector<std::int32_t> kept = window_rows(seen, window, cap, counts);
  std::vector<float> want(q.size()), w_kept(static_cast<std::size_t>(Hq * cap));
  attend_kept_ref(AttnShape{Hq, entries, d, cap}, q.data(), k.data(), v.data(), kept.data(), counts.data(), cap,
                  want.data(), w_kept.data());
  CHECK(nmse(out, want) < 1e-10);
  // The weights sit at the rows' places in the entry, zero before the window and past the rows.
  std::vector<float> w_want(w.size(), 0.0f);
  for (int h = 0; h < Hq; ++h) {
    const int e = h / (Hq / entries), lo = seen[static_cast<std::size_t>(e)] - window;
    for (int m = 0; m < counts[static_cast<std::size_t>(e)]; ++m)
      w_want[static_cast<std::size_t>(h * cap + lo + m)] = w_kept[static_cast<std::size_t>(h * cap + m)];
  }
  CHECK(nmse(w, w_want) < 1e-10);
  CHECK(w[static_cast<std::size_t>(cap + seen[0] - window - 1)] == 0.0f);  // head 1, the row just before its window
}

TEST_CASE("emulated: KV append places each KV head's rows in its entries", "[gpu-emu]") {
  const int n = 3, n_head_kv = 2, group = 3, d = 32;
  std::vector<std::uint16_t> kh(static_cast<std::size_t>(n * n_head_kv * d)), vh(kh.size());
  for (std::size_t i = 0; i < kh.size(); ++i)
    kh[i] = static_cast<std::uint16_t>(i), vh[i] = static_cast<std::uint16_t>(i + 7);
  for (const bool per_query_head : {false, true}) {
    INFO("per-query-head entries " << per_query_head);
    const int entries = per_query_head ? n_head_kv * group : n_head_kv, cap = 8, past = 2;
    std::vector<std::uint16_t> ck(static_cast<std::size_t>(entries * cap * d), 0), cv(ck.size(), 0);
    REQUIRE(kv_append(kh.data(), vh.data(), n, n_head_kv, d, same_rows(entries, past), per_query_head ? group : 1, cap,
                      ck.data(), cv.data(), nullptr) == cudaSuccess);
    for (int e = 0; e < entries; ++e) {
      const int kv = per_query_head ? e / group : e;  // entry e holds KV head e / entry_div
      for (int i = 0; i < n; ++i)
        for (int c = 0; c < d; ++c) {
          const auto at = (static_cast<std::size_t>(e) * cap + past + i) * d + c,
                     from = (static_cast<std::size_t>(i) * n_head_kv + kv) * d + c;
          REQUIRE(ck[at] == kh[from]);
          REQUIRE(cv[at] == vh[from]);
        }
    }
  }
}

TEST_CASE("emulated: decode rule steps evict what the reference evicts and compact the rows in place", "[gpu-emu]") {
  struct Case {
    const char* name;
    DecodeRule rule;
    int n_heads, entries;
    std::vector<int> rows;  // per entry at the first step, the new row included
    std::int64_t budget;
  };
  // Entries of unequal rows; rows past a 256-thread tile (the compaction's scan walks tiles);
  // several evictions at the first step, then one; a budget above the rows (nothing goes); a
  // protected window wider than what must go (only the unprotected rows can).
  for (const Case& c : {Case{"h2o sum", {true, false, HeadCombine::Sum, 10}, 6, 2, {300, 290}, 285},
                        Case{"h2o mean", {true, false, HeadCombine::Mean, 3}, 6, 3, {40, 41, 39}, 36},
                        Case{"h2o max", {true, false, HeadCombine::Max, 0}, 4, 4, {20, 20, 20, 20}, 25},
                        Case{"tova", {false, true, HeadCombine::Sum, 1}, 6, 2, {270, 270}, 264},
                        Case{"narrow", {true, false, HeadCombine::Sum, 18}, 2, 1, {20}, 1}}) {
    INFO(c.name);
    std::mt19937 rng(21);
    const int d = 32;
    const std::int64_t cap = 320;
    const auto eighths = [&] { return static_cast<float>(rng() % 8) / 8.0f; };
    DecodeRuleStart ref{c.rule, {}};
    const std::size_t scored = c.rule.layer_wide ? 1 : static_cast<std::size_t>(c.entries);
    std::vector<double> scores(scored * cap, std::nan(""));
    if (c.rule.accumulate)
      for (std::size_t e = 0; e < scored; ++e) {
        ref.scores.emplace_back();
        for (int j = 0; j + 1 < c.rows[e]; ++j) {
          ref.scores[e].push_back(eighths());
          scores[e * cap + static_cast<std::size_t>(j)] = ref.scores[e].back();
        }
      }
    std::vector<std::uint16_t> k = halves(gaussian(static_cast<std::size_t>(c.entries * cap * d), rng));
    std::vector<std::uint16_t> v = halves(gaussian(k.size(), rng));
    std::vector<std::int64_t> rows(c.rows.begin(), c.rows.end());
    for (int step = 0; step < 3; ++step) {
      const std::int64_t stride = *std::max_element(rows.begin(), rows.end());
      std::vector<float> w(static_cast<std::size_t>(c.n_heads * stride));
      for (auto& x : w) x = eighths();
      const auto want = decode_rule_step_ref(
          c.rule, ref.scores, rows, LastRowWeights{w.data(), stride, c.n_heads, c.n_heads / c.entries}, c.budget);
      const int report_stride = static_cast<int>(1 + std::max<std::int64_t>(stride - c.budget, 0));
      std::vector<std::uint8_t> gone(scored * static_cast<std::size_t>(stride), 0xab);
      std::vector<std::int32_t> kept(gone.size(), -7), report(static_cast<std::size_t>(c.entries * report_stride), -7);
      RuleStepArgs a;
      a.rule = c.rule;
      a.weights = w.data();
      a.stride = stride;
      a.n_heads = c.n_heads;
      a.heads_per_entry = c.n_heads / c.entries;
      a.rows.count = c.entries;
      for (int e = 0; e < c.entries; ++e) a.rows.rows[e] = static_cast<int>(rows[static_cast<std::size_t>(e)]);
      a.scores = scores.data();
      a.score_stride = cap;
      a.gone = gone.data();
      a.kept = kept.data();
      a.work_stride = stride;
      a.report = report.data();
      a.report_stride = report_stride;
      a.budget = c.budget;
      const auto k_before = k, v_before = v;
      REQUIRE(decode_rule_step(a, nullptr) == cudaSuccess);
      REQUIRE(compact_kept_rows(a, k.data(), v.data(), cap, d, nullptr) == cudaSuccess);
      INFO("step " << step);
      for (int e = 0; e < c.entries; ++e) {
        const auto& gone_rows = want[static_cast<std::size_t>(e)];
        const std::int32_t* rep = report.data() + e * report_stride;
        REQUIRE(rep[0] == static_cast<std::int32_t>(gone_rows.size()));
        CHECK(std::vector<std::int64_t>(rep + 1, rep + 1 + rep[0]) == gone_rows);
        // The kept rows, in order, at the front of the entry's rows; its scores compacted with them.
        std::vector<std::uint16_t> wk, wv,
            gk(k.begin() + e * cap * d, k.begin() + e * cap * d + (rows[static_cast<std::size_t>(e)] - rep[0]) * d);
        std::vector<std::uint16_t> gv(v.begin() + e * cap * d,
                                      v.begin() + e * cap * d + (rows[static_cast<std::size_t>(e)] - rep[0]) * d);
        for (std::int64_t j = 0; j < rows[static_cast<std::size_t>(e)]; ++j) {
          if (std::binary_search(gone_rows.begin(), gone_rows.end(), j)) continue;
          wk.insert(wk.end(), k_before.begin() + (e * cap + j) * d, k_before.begin() + (e * cap + j + 1) * d);
          wv.insert(wv.end(), v_before.begin() + (e * cap + j) * d, v_before.begin() + (e * cap + j + 1) * d);
        }
        CHECK(gk == wk);
        CHECK(gv == wv);
        rows[static_cast<std::size_t>(e)] -= rep[0];
      }
      if (c.rule.accumulate)
        for (std::size_t e = 0; e < scored; ++e)
          CHECK(std::vector<double>(scores.begin() + static_cast<std::ptrdiff_t>(e * cap),
                                    scores.begin() + static_cast<std::ptrdiff_t>(e * cap + ref.scores[e].size())) ==
                ref.scores[e]);
      for (auto& n : rows) ++n;  // the next step's new row
    }
  }
}

TEST_CASE("emulated: a launch a GPU would refuse fails as it would", "[gpu-emu]") {
  const std::vector<float> q(32, 1.0f);
  const std::vector<std::uint16_t> k(32, 0);
  std::vector<float> w(1, 0.0f);
  // No query heads: a grid of no blocks, which the runtime refuses (invalid configuration).
  CHECK(last_row_weights(q.data(), 0, 32, 1, k.data(), 1, same_rows(1, 1), 0, 1.0f, w.data(), 1, nullptr) ==
        cudaErrorInvalidConfiguration);
  CHECK(cudaGetLastError() == cudaSuccess);  // the wrapper took it
  CHECK(last_row_weights(q.data(), 1, 32, 1, k.data(), 1, same_rows(1, 1), 0, 1.0f, w.data(), 1, nullptr) ==
        cudaSuccess);
  CHECK(w[0] == 1.0f);  // one key: all the weight
}

// gpu/parity/transformer_parity.cpp's whole check, as the device runs it (prefill with capture, decode
// with last-row weights, device eviction, chunked prefill, a per-query-head cache, a packed cache
// held packed with fused and unpack decodes, decode rules), with the CUDA backend's host code
// (gpu/cuda_transformer.cpp) over the emulated runtime, cuBLAS and kernels. A test per shape, so
// ctest spreads them and a failure names its shape. The 1500-token prompt (decode split over many
// blocks, prefill over many key tiles) runs for one shape: about 50 s here.
void check_transformer(const std::string& label, const ModelConfig& shape, DeviceWeights w, bool long_prompt = false) {
  ParityReport r;
  transformer_parity(label, shape, w, r, long_prompt);
  CHECK(r.failures == 0);
}

TEST_CASE("emulated: the CUDA transformer matches its reference, qwen2-like fp32", "[gpu-emu]") {
  check_transformer("qwen2-like", qwen_like_shape(), DeviceWeights::F32, true);
}

TEST_CASE("emulated: the CUDA transformer matches its reference, qwen2-like fp16", "[gpu-emu]") {
  check_transformer("qwen2-like", qwen_like_shape(), DeviceWeights::F16);
}

TEST_CASE("emulated: the CUDA transformer matches its reference, gemma3-like fp32", "[gpu-emu]") {
  check_transformer("gemma3-like", gemma_like_shape(), DeviceWeights::F32);
}

TEST_CASE("emulated: the CUDA transformer matches its reference, gemma3-like fp16", "[gpu-emu]") {
  check_transformer("gemma3-like", gemma_like_shape(), DeviceWeights::F16);
}

void check_corner(std::size_t i) {
  const auto shapes = kernel_corner_shapes();
  check_transformer(shapes.at(i).first, shapes.at(i).second, DeviceWeights::F16);
}

TEST_CASE("emulated: the CUDA transformer matches its reference, head_dim 32 corner shape", "[gpu-emu]") {
  check_corner(0);
}
TEST_CASE("emulated: the CUDA transformer matches its reference, head_dim 96 corner shape", "[gpu-emu]") {
  check_corner(1);
}
TEST_CASE("emulated: the CUDA transformer matches its reference, head_dim 256 corner shape", "[gpu-emu]") {
  check_corner(2);
}
