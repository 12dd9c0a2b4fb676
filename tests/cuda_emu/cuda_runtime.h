#pragma once
// The CUDA runtime as tests/cuda_emu runs the project's kernels on the CPU: the types and the few
// calls the kernel files and their launch wrappers make; device memory is host memory.
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "cuda_emu.h"

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorNotSupported = 801,
};
using cudaError = cudaError_t;
struct CUstream_st;
using cudaStream_t = CUstream_st*;
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16, cudaDevAttrMemoryPoolsSupported = 115 };

struct float2 {
  float x, y;
};

inline const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    default: return "unknown error";
  }
}
inline cudaError_t cudaGetLastError() { return static_cast<cudaError_t>(::emu::take_last_error()); }
inline cudaError_t cudaGetDevice(int* d) {
  *d = 0;
  return cudaSuccess;
}
inline cudaError_t cudaGetDeviceCount(int* n) {
  *n = 1;
  return cudaSuccess;
}
// An H200's 132 SMs: the split decode divides long caches as it would there.
inline cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int) {
  *v = a == cudaDevAttrMultiProcessorCount ? 132 : 1;
  return cudaSuccess;
}
inline cudaError_t cudaMalloc(void** p, std::size_t bytes) {
  *p = std::malloc(bytes == 0 ? 1 : bytes);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
inline cudaError_t cudaFree(void* p) {
  std::free(p);
  return cudaSuccess;
}
inline cudaError_t cudaMallocAsync(void** p, std::size_t bytes, cudaStream_t) { return cudaMalloc(p, bytes); }
inline cudaError_t cudaFreeAsync(void* p, cudaStream_t) { return cudaFree(p); }
inline cudaError_t cudaMemsetAsync(void* p, int v, std::size_t bytes, cudaStream_t = nullptr) {
  std::memset(p, v, bytes);
  return cudaSuccess;
}

inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
// CUDA's device min/max take mixed integer types.
template <class A, class B>
auto min(A a, B b) -> std::common_type_t<A, B> {
  return b < a ? b : a;
}
template <class A, class B>
auto max(A a, B b) -> std::common_type_t<A, B> {
  return a < b ? b : a;
}
