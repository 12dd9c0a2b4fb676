// kvsim-parity: the packed-cache kernels against their CPU references on random problems at
// SmolLM2-135M and Mistral-7B shapes, then the CUDA transformer against its reference with random
// weights, decode-rule steps included; NMSE limits 1e-6 (kernels), 1e-5 / 1e-4 (transformer, fp32
// / fp16 weights), keep-sets identical. --bench adds bandwidth and tokens/s against the device's
// own copy and GEMM rates; --smoke runs the benchmarks' code at tiny sizes (the emulator does).
// Exit 77: no GPU (ctest: skipped). docs/gpu.md, gpu/parity/README.md.
//   kvsim-parity [--bench [--smoke]] [--report FILE] [--only NAME,...] [--list]
#include <cstdio>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"
#include "core/split.h"
#include "gpu/cuda_check.h"
#include "gpu/device_alloc.h"
#include "gpu/parity/half_convert.cuh"
#include "gpu/parity/packed_parity.h"
#include "gpu/parity/parity_buffers.h"
#include "gpu/parity/parity_report.h"
#include "gpu/parity/transformer_parity.h"
#include "gpu/transformer_shape.h"

using namespace kvsim;
using namespace kvsim::gpu;

namespace {

// Named sections, each run on its own: an exception in one (a failed check of shapes, a CUDA
// error) is reported as a failure and the next section runs, unless the device context is lost.
struct Section {
  std::string name;
  std::function<void()> run;
};

// After a section threw: a sticky CUDA error (an illegal address, a kernel trap) leaves the
// context unusable for every later section; an ordinary error is cleared.
bool device_context_lost() {
  (void)cudaGetLastError();                       // an ordinary launch error is returned once, then cleared
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
    if (a == "--bench")
      bench.on = true;
    else if (a == "--smoke")
      bench.smoke = true;
    else if (a == "--list")
      list = true;
    else if (a == "--report" && i + 1 < argc)
      report_path = argv[++i];
    else if (a == "--only" && i + 1 < argc)
      only = split(argv[++i], ',');
    else {
      std::fprintf(stderr, "%s", kUsage);
      return 2;
    }
  }
  ParityReport r;
  double copy_gbs = 0;
  std::vector<Section> sections = {
      {"packed unpack: SmolLM2-135M shapes",
       [&] { packed_unpack_parity("SmolLM2-135M shapes", 64, 4096, bench, r, copy_gbs); }},
      {"packed unpack: Mistral-7B shapes",
       [&] { packed_unpack_parity("Mistral-7B shapes", 128, 32768, bench, r, copy_gbs); }},
      {"packed decode: SmolLM2-135M shapes",
       [&] {
         packed_decode_parity("SmolLM2-135M shapes", AttnShape{9, 3, 64, 4096}, bench, r, copy_gbs);
       }},
      {"packed decode: Mistral-7B shapes",
       [&] {
         packed_decode_parity("Mistral-7B shapes", AttnShape{32, 8, 128, 8192}, bench, r, copy_gbs);
       }},
      // The transformer backend against its reference: fp32 weights (tight), then fp16 as deployed.
      {"transformer: qwen2-like fp32",
       [&] { transformer_parity("qwen2-like", qwen_like_shape(), DeviceWeights::F32, r); }},
      {"transformer: qwen2-like fp16",
       [&] { transformer_parity("qwen2-like", qwen_like_shape(), DeviceWeights::F16, r); }},
      {"transformer: gemma3-like fp32",
       [&] { transformer_parity("gemma3-like", gemma_like_shape(), DeviceWeights::F32, r); }},
      {"transformer: gemma3-like fp16",
       [&] { transformer_parity("gemma3-like", gemma_like_shape(), DeviceWeights::F16, r); }},
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
    sections.push_back({"bench: Mistral-7B shapes (2 layers)", [&] {
                          transformer_bench("Mistral-7B shapes (2 layers)", mistral7b_shape(2), bench, r, copy_gbs);
                        }});
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
           std::to_string(prop.minor) +
           (memory_pools_supported() ? ", memory pools (stream-ordered allocation)"
                                     : ", no memory pools (cudaMalloc fallback)"));
    if (bench) {  // device-to-device copy of 1 GiB: read + write bytes per second
      const auto bytes = static_cast<std::size_t>(bench.size(std::int64_t{1} << 30, std::int64_t{1} << 20));
      DeviceBuffer<std::uint8_t> a(bytes), b(bytes);
      const double t = seconds_of([&] { KVSIM_CUDA_CHECK(cudaMemcpy(b.ptr, a.ptr, bytes, cudaMemcpyDeviceToDevice)); },
                                  bench.reps(10));
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
