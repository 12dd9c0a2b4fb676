#include "gpu/parity/half_convert.cuh"

#include <cuda_fp16.h>

namespace kvsim::gpu {

static __global__ void halves_to_floats_kernel(const std::uint16_t* __restrict__ src, float* __restrict__ dst,
                                               std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    __half_raw raw;
    raw.x = src[i];
    dst[i] = __half2float(__half(raw));
  }
}

cudaError_t halves_to_floats(const std::uint16_t* src, float* dst, std::size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const std::size_t blocks = (n + kThreads - 1) / kThreads;
  const int grid = static_cast<int>(blocks < 65535 ? blocks : 65535);
  halves_to_floats_kernel<<<grid, kThreads, 0, stream>>>(src, dst, n);
  return cudaGetLastError();
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

}  // namespace kvsim::gpu
