// GPU parity for the f16 -> f32 kernel against the CPU reference, bit for bit over all 65536
// halves. Exits 77 (ctest: skipped) when no GPU is present: never a silent pass.
#include <cstdio>
#include <cstring>
#include <vector>

#include "core/half.h"
#include "gpu/cuda_check.h"
#include "gpu/parity/half_convert.cuh"

int main() {
  if (kvsim::gpu::device_count() == 0) {
    std::printf("skipped (no GPU)\n");
    return 77;
  }
  std::vector<std::uint16_t> src(65536);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::uint16_t>(i);
  std::vector<float> cpu(src.size()), gpu(src.size());
  kvsim::halves_to_floats_scalar(src.data(), cpu.data(), src.size());
  std::uint16_t* d_src = nullptr;
  float* d_dst = nullptr;
  KVSIM_CUDA_CHECK(cudaMalloc(&d_src, src.size() * sizeof(std::uint16_t)));
  KVSIM_CUDA_CHECK(cudaMalloc(&d_dst, src.size() * sizeof(float)));
  KVSIM_CUDA_CHECK(cudaMemcpy(d_src, src.data(), src.size() * sizeof(std::uint16_t), cudaMemcpyHostToDevice));
  KVSIM_CUDA_CHECK(kvsim::gpu::halves_to_floats(d_src, d_dst, src.size(), nullptr));
  KVSIM_CUDA_CHECK(cudaMemcpy(gpu.data(), d_dst, gpu.size() * sizeof(float), cudaMemcpyDeviceToHost));
  cudaFree(d_src);
  cudaFree(d_dst);
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < src.size(); ++i) {
    const bool nan_both = cpu[i] != cpu[i] && gpu[i] != gpu[i];  // NaN payload quieting may differ
    if (!nan_both && std::memcmp(&cpu[i], &gpu[i], sizeof(float)) != 0) ++mismatches;
  }
  std::printf("gpu half parity: %zu mismatches of %zu\n", mismatches, src.size());
  return mismatches == 0 ? 0 : 1;
}
