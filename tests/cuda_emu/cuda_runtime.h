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
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    default:
      return "unknown error";
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
// Device memory starts as NaN bytes, as dynamic shared memory does: a kernel that reads what it
// never wrote shows (large mallocs would otherwise come back zeroed and hide it).
inline cudaError_t cudaMalloc(void** p, std::size_t bytes) {
  *p = std::malloc(bytes == 0 ? 1 : bytes);
  if (!*p) return cudaErrorMemoryAllocation;
  std::memset(*p, 0xFF, bytes);
  return cudaSuccess;
}
inline cudaError_t cudaFree(void* p) {
  std::free(p);
  return cudaSuccess;
}
// The runtime's typed overload.
template <class T>
cudaError_t cudaMalloc(T** p, std::size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(p), bytes);
}
inline cudaError_t cudaMallocAsync(void** p, std::size_t bytes, cudaStream_t) { return cudaMalloc(p, bytes); }
inline cudaError_t cudaFreeAsync(void* p, cudaStream_t) { return cudaFree(p); }
inline cudaError_t cudaMemsetAsync(void* p, int v, std::size_t bytes, cudaStream_t = nullptr) {
  std::memset(p, v, bytes);
  return cudaSuccess;
}

// Streams and events: everything runs in order, at once, so they only need to exist.
struct CUevent_st;
using cudaEvent_t = CUevent_st*;
constexpr unsigned cudaStreamNonBlocking = 1, cudaEventDisableTiming = 2;
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
struct cudaDeviceProp {
  char name[256] = "cuda_emu (CPU)";
  std::size_t totalGlobalMem = std::size_t{1} << 34;
  int major = 9, minor = 0, multiProcessorCount = 132;
};

inline cudaError_t cudaSetDevice(int) { return cudaSuccess; }
inline cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int) {
  *p = cudaDeviceProp{};
  return cudaSuccess;
}
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
  *s = reinterpret_cast<cudaStream_t>(new char);
  return cudaSuccess;
}
inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete reinterpret_cast<char*>(s);
  return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) {
  *e = reinterpret_cast<cudaEvent_t>(new char);
  return cudaSuccess;
}
inline cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete reinterpret_cast<char*>(e);
  return cudaSuccess;
}
inline cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t = nullptr) { return cudaSuccess; }
inline cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
inline cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned = 0) { return cudaSuccess; }
inline cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind) {
  if (bytes) std::memcpy(dst, src, bytes);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                                   cudaStream_t = nullptr) {
  return cudaMemcpy(dst, src, bytes, kind);
}
inline cudaError_t cudaMemset(void* p, int v, std::size_t bytes) {
  std::memset(p, v, bytes);
  return cudaSuccess;
}
inline cudaError_t cudaMallocHost(void** p, std::size_t bytes) { return cudaMalloc(p, bytes); }
inline cudaError_t cudaFreeHost(void* p) { return cudaFree(p); }

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
