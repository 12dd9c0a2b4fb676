// kvsim-parity: every compressed-attention and statistics kernel against its CPU reference
// (gpu/attention_ref.h) on random problems at SmolLM2-135M and Mistral-7B shapes, then the CUDA
// transformer against gpu/transformer_ref.h with random weights (gpu/transformer_parity.h).
// Kernel values pass at NMSE <= 1e-6 (fp32 accumulation in a different order), the transformer's
// at 1e-5 (fp32 weights) or 1e-4 (fp16: an input near a rounding boundary may round the other
// way); keep-sets must be identical sets. With --bench it also times each attention kernel
// against the device's own copy bandwidth, and the transformer's prefill and decode against the
// cuBLAS GEMM rate, all measured in the same run; --smoke runs the benchmarks at tiny sizes (their
// code, not their figures: tests/ runs it on the CPU emulator). Exit 77: no GPU (ctest: skipped).
//   kvsim-parity [--bench [--smoke]] [--report FILE] [--only NAME,...] [--list]
#include <cstdio>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"
#include "core/split.h"
#include "gpu/attention_ref.h"
#include "gpu/compressed_attention.cuh"
#include "gpu/cuda_check.h"
#include "gpu/device_alloc.h"
#include "gpu/half_convert.cuh"
#include "gpu/packed_parity.h"
#include "gpu/parity_buffers.h"
#include "gpu/parity_report.h"
#include "gpu/transformer_parity.h"
#include "gpu/transformer_shape.h"

using namespace kvsim;
using namespace kvsim::gpu;

namespace {

struct Problem {
  std::string name;
  AttnShape shape;
  int kept;  // tokens kept per KV head
};

// The kernels' checks: fp32 accumulation in a different order only.
struct Report : ParityReport {
  void value(const std::string& what, double nmse) { ParityReport::value(what, nmse, kKernelNmse); }
};

void run(const Problem& p, const Bench& bench, Report& r, double copy_gbs) {
  const AttnShape& s = p.shape;
  const int d = s.head_dim, Hq = s.n_q_heads, Hkv = s.n_kv_heads;
  std::mt19937 rng(42);
  r.line(p.name + ": " + std::to_string(Hq) + " query heads, " + std::to_string(Hkv) + " KV heads, head_dim " +
         std::to_string(d) + ", cache " + std::to_string(s.capacity) + " tokens, kept " + std::to_string(p.kept));
  const auto rows = static_cast<std::size_t>(Hkv * s.capacity * d);
  const std::vector<float> q = gaussian(static_cast<std::size_t>(Hq * d), rng);
  const std::vector<float> kf = gaussian(rows, rng), vf = gaussian(rows, rng);
  const std::vector<std::uint16_t> k = halves(kf), v = halves(vf);
  // Kept sets: `kept` tokens per head, evenly spaced (capacity / kept apart) up to the most recent.
  std::vector<std::int32_t> kept(static_cast<std::size_t>(Hkv * p.kept)), counts(static_cast<std::size_t>(Hkv), p.kept);
  for (int h = 0; h < Hkv; ++h)
    for (int m = 0; m < p.kept; ++m)
      kept[static_cast<std::size_t>(h * p.kept + m)] =
          static_cast<std::int32_t>(s.capacity - 1 - static_cast<std::int64_t>(p.kept - 1 - m) * (s.capacity / p.kept));
  std::vector<float> out_ref(static_cast<std::size_t>(Hq * d)), w_ref(static_cast<std::size_t>(Hq * p.kept));
  attend_kept_ref(s, q.data(), k.data(), v.data(), kept.data(), counts.data(), p.kept, out_ref.data(), w_ref.data());
  DeviceBuffer<float> dq(q), dout(out_ref.size()), dw(w_ref.size());
  DeviceBuffer<std::uint16_t> dk(k), dv(v);
  DeviceBuffer<std::int32_t> dkept(kept), dcounts(counts);
  KVSIM_CUDA_CHECK(attend_kept(s, dq.ptr, dk.ptr, dv.ptr, dkept.ptr, dcounts.ptr, p.kept, dout.ptr, dw.ptr, nullptr));
  r.value("attention over kept indices: output", nmse(dout.host(), out_ref));
  r.value("attention over kept indices: weights", nmse(dw.host(), w_ref));
  if (bench) {
    const double t = seconds_of([&] {
      KVSIM_CUDA_CHECK(attend_kept(s, dq.ptr, dk.ptr, dv.ptr, dkept.ptr, dcounts.ptr, p.kept, dout.ptr, dw.ptr, nullptr));
    }, bench.reps(20));
    // Bytes the kernel must read: the kept K and V rows (fp16), once per query head group.
    const double bytes = 2.0 * Hkv * p.kept * d * 2.0;
    char buf[200];
    std::snprintf(buf, sizeof buf, "  bench kept-index attention: %.1f us, %.1f GB/s = %.2f of copy bandwidth", t * 1e6,
                  bytes / t / 1e9, bytes / t / 1e9 / copy_gbs);
    r.line(buf);
  }
  for (const QuantSpec spec : {QuantSpec{8, 32, false}, QuantSpec{4, 32, false}, QuantSpec{2, 32, false}, QuantSpec{4, 64, true}}) {
    const int rb = spec.row_bytes(d), ng = spec.groups(d);
    std::vector<std::uint8_t> kc(static_cast<std::size_t>(Hkv * s.capacity * rb)), vc(kc.size());
    std::vector<std::uint16_t> kp(static_cast<std::size_t>(Hkv * s.capacity * ng * 2)), vp(kp.size());
    pack_int_rows(spec, d, kf.data(), Hkv * s.capacity, kc.data(), kp.data());
    pack_int_rows(spec, d, vf.data(), Hkv * s.capacity, vc.data(), vp.data());
    std::vector<std::int32_t> all(static_cast<std::size_t>(Hkv), static_cast<std::int32_t>(s.capacity));
    attend_quant_ref(s, spec, q.data(), kc.data(), kp.data(), vc.data(), vp.data(), all.data(), out_ref.data());
    DeviceBuffer<std::uint8_t> dkc(kc), dvc(vc);
    DeviceBuffer<std::uint16_t> dkp(kp), dvp(vp);
    DeviceBuffer<std::int32_t> dall(all);
    DeviceBuffer<float> scratch(static_cast<std::size_t>(Hq * s.capacity));
    KVSIM_CUDA_CHECK(attend_quant(s, spec, dq.ptr, dkc.ptr, dkp.ptr, dvc.ptr, dvp.ptr, dall.ptr, dout.ptr, scratch.ptr, nullptr));
    const std::string label = "int" + std::to_string(spec.bits) + " g" + std::to_string(spec.group) +
                              (spec.symmetric ? " absmax" : " min-max") + " attention";
    r.value(label, nmse(dout.host(), out_ref));
    if (bench) {
      const double t = seconds_of([&] {
        KVSIM_CUDA_CHECK(attend_quant(s, spec, dq.ptr, dkc.ptr, dkp.ptr, dvc.ptr, dvp.ptr, dall.ptr, dout.ptr, scratch.ptr, nullptr));
      }, bench.reps(20));
      const double bytes = 2.0 * Hkv * static_cast<double>(s.capacity) * (rb + ng * 4.0);
      char buf[200];
      std::snprintf(buf, sizeof buf, "  bench %s: %.1f us, %.1f GB/s = %.2f of copy bandwidth", label.c_str(), t * 1e6,
                    bytes / t / 1e9, bytes / t / 1e9 / copy_gbs);
      r.line(buf);
    }
  }
  {  // Low-rank: random bases and coefficients, ranks 1..d, NEOX RoPE at the tokens' positions.
    const RopeShape rope{true, d};
    std::vector<float> cos_t, sin_t;
    rope_tables(RopeSpec{RopeType::Neox, d, d, 10000.0}, s.capacity, cos_t, sin_t);
    const auto ck = halves(gaussian(rows, rng)), cv = halves(gaussian(rows, rng));
    const auto uk = halves(gaussian(static_cast<std::size_t>(Hkv * d * d), rng, 0.125f));
    const auto uv = halves(gaussian(static_cast<std::size_t>(Hkv * d * d), rng, 0.125f));
    std::vector<std::int32_t> ranks(static_cast<std::size_t>(Hkv * s.capacity)), positions(static_cast<std::size_t>(s.capacity));
    std::uniform_int_distribution<int> rank(1, d);
    for (auto& x : ranks) x = rank(rng);
    for (std::int64_t j = 0; j < s.capacity; ++j) positions[static_cast<std::size_t>(j)] = static_cast<std::int32_t>(j);
    // Long caches take the block a token at a time: the parity needs only a prefix.
    const int n = static_cast<int>(std::min<std::int64_t>(s.capacity, 2048));
    const std::vector<std::int32_t> cnt(static_cast<std::size_t>(Hkv), n);
    attend_lowrank_ref(s, rope, q.data(), ck.data(), cv.data(), ranks.data(), uk.data(), uv.data(), positions.data(),
                       cos_t.data(), sin_t.data(), cnt.data(), out_ref.data());
    DeviceBuffer<std::uint16_t> dck(ck), dcv(cv), duk(uk), duv(uv);
    DeviceBuffer<std::int32_t> dranks(ranks), dpos(positions), dcnt(cnt);
    DeviceBuffer<float> dcos(cos_t), dsin(sin_t), scratch(static_cast<std::size_t>(Hq * s.capacity));
    auto launch = [&] {
      KVSIM_CUDA_CHECK(attend_lowrank(s, rope, dq.ptr, dck.ptr, dcv.ptr, dranks.ptr, duk.ptr, duv.ptr, dpos.ptr, dcos.ptr,
                                      dsin.ptr, dcnt.ptr, dout.ptr, scratch.ptr, nullptr));
    };
    launch();
    r.value("low-rank attention (" + std::to_string(n) + " tokens)", nmse(dout.host(), out_ref));
    if (bench) {
      const double t = seconds_of(launch, bench.reps(5));
      const double bytes = 2.0 * Hkv * n * d * 2.0;  // coefficient rows read (upper bound: full rank)
      char buf[200];
      std::snprintf(buf, sizeof buf, "  bench low-rank attention: %.1f us, %.1f GB/s = %.2f of copy bandwidth", t * 1e6,
                    bytes / t / 1e9, bytes / t / 1e9 / copy_gbs);
      r.line(buf);
    }
  }
  // Statistics: accumulated attention over a 32-query window, then top-k with protected tokens.
  const int window = 32, n = static_cast<int>(s.capacity);
  std::vector<float> att(static_cast<std::size_t>(Hq) * window * n);
  std::uniform_real_distribution<float> ud(0.0f, 1.0f);
  for (auto& x : att) x = ud(rng);
  std::vector<float> sums_ref(static_cast<std::size_t>(Hq) * n);
  column_sums_ref(att.data(), Hq, window, n, sums_ref.data());
  DeviceBuffer<float> datt(att), dsums(sums_ref.size());
  KVSIM_CUDA_CHECK(column_sums(datt.ptr, Hq, window, n, dsums.ptr, nullptr));
  r.value("column sums (accumulated attention)", nmse(dsums.host(), sums_ref));
  // Scores with deliberate ties (quantized to 1/64) and the last 16 tokens protected.
  std::vector<float> scores = sums_ref;
  for (auto& x : scores) x = std::round(x * 4.0f) / 64.0f;
  std::vector<std::uint8_t> protect(scores.size(), 0), keep_ref(scores.size());
  for (int h = 0; h < Hq; ++h)
    for (int j = n - 16; j < n; ++j) protect[static_cast<std::size_t>(h) * n + j] = 1;
  top_k_ref(scores.data(), protect.data(), Hq, n, p.kept, keep_ref.data());
  DeviceBuffer<float> dscores(scores);
  DeviceBuffer<std::uint8_t> dprotect(protect), dkeep(keep_ref.size());
  KVSIM_CUDA_CHECK(top_k(dscores.ptr, dprotect.ptr, Hq, n, p.kept, dkeep.ptr, nullptr));
  r.same("top-k keep-sets (ties to the recent token)", dkeep.host() == keep_ref);
}

// Named sections, each run on its own: an exception in one (a failed check of shapes, a CUDA
// error) is reported as a failure and the next section runs, unless the device context is lost.
struct Section {
  std::string name;
  std::function<void()> run;
};

// After a section threw: a sticky CUDA error (an illegal address, a kernel trap) leaves the
// context unusable for every later section; an ordinary error is cleared.
bool device_context_lost() {
  (void)cudaGetLastError();  // an ordinary launch error is returned once, then cleared
  return cudaDeviceSynchronize() != cudaSuccess;  // a sticky one comes back from every call
}

bool selected(const std::string& name, const std::vector<std::string>& only) {
  if (only.empty()) return true;
  for (const auto& o : only)
    if (name.find(o) != std::string::npos) return true;
  return false;
}

constexpr const char* kUsage = "usage: kvsim-parity [--bench [--smoke]] [--report FILE] [--only NAME,...] [--list]\n";

}  // namespace

int main(int argc, char** argv) {
  Bench bench;
  bool list = false;
  std::string report_path;
  std::vector<std::string> only;  // substrings of section names
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--bench") bench.on = true;
    else if (a == "--smoke") bench.smoke = true;
    else if (a == "--list") list = true;
    else if (a == "--report" && i + 1 < argc) report_path = argv[++i];
    else if (a == "--only" && i + 1 < argc) only = split(argv[++i], ',');
    else {
      std::fprintf(stderr, "%s", kUsage);
      return 2;
    }
  }
  Report r;
  double copy_gbs = 0;
  std::vector<Section> sections = {
      {"kernels: SmolLM2-135M shapes", [&] { run({"SmolLM2-135M shapes", AttnShape{9, 3, 64, 4096}, 1024}, bench, r, copy_gbs); }},
      {"kernels: Mistral-7B shapes", [&] { run({"Mistral-7B shapes", AttnShape{32, 8, 128, 32768}, 8192}, bench, r, copy_gbs); }},
      {"packed unpack: SmolLM2-135M shapes", [&] { packed_unpack_parity("SmolLM2-135M shapes", 64, 4096, bench, r, copy_gbs); }},
      {"packed unpack: Mistral-7B shapes", [&] { packed_unpack_parity("Mistral-7B shapes", 128, 32768, bench, r, copy_gbs); }},
      {"packed decode: SmolLM2-135M shapes",
       [&] { packed_decode_parity("SmolLM2-135M shapes", AttnShape{9, 3, 64, 4096}, bench, r, copy_gbs); }},
      {"packed decode: Mistral-7B shapes",
       [&] { packed_decode_parity("Mistral-7B shapes", AttnShape{32, 8, 128, 8192}, bench, r, copy_gbs); }},
      // The transformer backend against its reference: fp32 weights (tight), then fp16 as deployed.
      {"transformer: qwen2-like fp32", [&] { transformer_parity("qwen2-like", qwen_like_shape(), DeviceWeights::F32, r); }},
      {"transformer: qwen2-like fp16", [&] { transformer_parity("qwen2-like", qwen_like_shape(), DeviceWeights::F16, r); }},
  };
  for (const auto& [label, shape] : kernel_corner_shapes())
    sections.push_back({"transformer: " + label, [&r, label = label, shape = shape] {
                          transformer_parity(label, shape, DeviceWeights::F16, r);
                        }});
  sections.push_back({"transformer: SmolLM2-135M shapes",
                      [&] { transformer_parity("SmolLM2-135M shapes", smollm2_shape(), DeviceWeights::F16, r); }});
  sections.push_back({"transformer: Mistral-7B shapes",
                      [&] { transformer_parity("Mistral-7B shapes", mistral7b_shape(2), DeviceWeights::F16, r); }});
  if (bench) {
    sections.push_back({"bench: SmolLM2-135M shapes",
                        [&] { transformer_bench("SmolLM2-135M shapes", smollm2_shape(), bench, r, copy_gbs); }});
    sections.push_back({"bench: Mistral-7B shapes (2 layers)",
                        [&] { transformer_bench("Mistral-7B shapes (2 layers)", mistral7b_shape(2), bench, r, copy_gbs); }});
  }
  if (list) {
    for (const auto& sec : sections) std::printf("%s\n", sec.name.c_str());
    return 0;
  }
  std::size_t chosen = 0;
  for (const auto& sec : sections) chosen += selected(sec.name, only);
  if (chosen == 0) {
    std::fprintf(stderr, "kvsim-parity: --only matches no section (see --list)\n");
    return 2;
  }
  if (device_count() == 0) {
    std::printf("skipped (no GPU)\n");
    return 77;
  }
  if (!report_path.empty() && !r.open(report_path)) {
    std::fprintf(stderr, "kvsim-parity: cannot write the report file %s\n", report_path.c_str());
    return 1;
  }
  try {
    cudaDeviceProp prop{};
    KVSIM_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    r.line(std::string("device: ") + prop.name + ", compute capability " + std::to_string(prop.major) + "." +
           std::to_string(prop.minor) + (memory_pools_supported() ? ", memory pools (stream-ordered allocation)"
                                                                   : ", no memory pools (cudaMalloc fallback)"));
    if (bench) {  // device-to-device copy of 1 GiB: read + write bytes per second
      const auto bytes = static_cast<std::size_t>(bench.size(std::int64_t{1} << 30, std::int64_t{1} << 20));
      DeviceBuffer<std::uint8_t> a(bytes), b(bytes);
      const double t = seconds_of([&] { KVSIM_CUDA_CHECK(cudaMemcpy(b.ptr, a.ptr, bytes, cudaMemcpyDeviceToDevice)); }, bench.reps(10));
      copy_gbs = 2.0 * static_cast<double>(bytes) / t / 1e9;
      char buf[120];
      std::snprintf(buf, sizeof buf, "device copy bandwidth: %.1f GB/s (read + write)", copy_gbs);
      r.line(buf);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvsim-parity: %s\n", e.what());
    return 1;
  }
  for (std::size_t k = 0; k < sections.size(); ++k) {
    const Section& sec = sections[k];
    if (!selected(sec.name, only)) continue;
    r.line("== " + sec.name);
    try {
      sec.run();
    } catch (const std::exception& e) {
      r.fail(sec.name + " stopped: " + e.what());
      if (device_context_lost()) {
        std::size_t left = 0;
        for (std::size_t j = k + 1; j < sections.size(); ++j) left += selected(sections[j].name, only);
        r.fail("the CUDA context is lost; sections not run: " + std::to_string(left));
        break;
      }
    }
  }
  r.line(r.failures == 0 ? "parity: passed" : "parity: " + std::to_string(r.failures) + " check(s) FAILED");
  return r.failures == 0 ? 0 : 1;
}
