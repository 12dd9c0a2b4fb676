#pragma once
// Small device helpers the kernel files share: fp16 bits in and out, warp and block reductions.
#include <cuda_fp16.h>

#include <cstdint>

namespace kvsim::gpu {

__device__ __forceinline__ float from_half(std::uint16_t h) { return __half2float(__ushort_as_half(h)); }

__device__ __forceinline__ std::uint16_t to_half(float x) { return __half_as_ushort(__float2half_rn(x)); }

// Element i of an fp32 or fp16 output (the next GEMM's input type).
__device__ __forceinline__ void store(void* out, std::int64_t i, float x, bool half_out) {
  if (half_out)
    static_cast<std::uint16_t*>(out)[i] = to_half(x);
  else
    static_cast<float*>(out)[i] = x;
}

__device__ __forceinline__ float warp_max(float x) {
  for (int off = 16; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
  return x;
}

__device__ __forceinline__ float warp_sum(float x) {
  for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

// Block-wide max or sum through shared memory (blockDim.x a multiple of 32, `shared` one slot per
// warp); every thread gets the result.
template <bool kMax>
__device__ float block_reduce(float x, float* shared) {
  x = kMax ? warp_max(x) : warp_sum(x);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) shared[warp] = x;
  __syncthreads();
  if (threadIdx.x == 0) {
    float r = shared[0];
    for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) r = kMax ? fmaxf(r, shared[w]) : r + shared[w];
    shared[0] = r;
  }
  __syncthreads();
  const float r = shared[0];
  __syncthreads();
  return r;
}

}  // namespace kvsim::gpu
