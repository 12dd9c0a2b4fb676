#pragma once
// What the parity harness's kernel sections share: device buffers made from host vectors, random
// inputs, and a timer. Host C++ over the CUDA runtime (no kernels).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/half.h"
#include "gpu/cuda_check.h"
#include "gpu/parity/random_inputs.h"

namespace kvsim::gpu {

// Kernel values against their CPU references: fp32 accumulation in a different order, and rows a
// kernel rebuilds in fp16 where a reference keeps them in fp32 (the fused packed decode against
// attend_quant_ref: NMSE about 6e-8 at int4 g32).
constexpr double kKernelNmse = 1e-6;

template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  std::size_t n = 0;
  explicit DeviceBuffer(const std::vector<T>& host) : n(host.size()) {
    KVSIM_CUDA_CHECK(cudaMalloc(&ptr, std::max<std::size_t>(n, 1) * sizeof(T)));
    if (n) KVSIM_CUDA_CHECK(cudaMemcpy(ptr, host.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  explicit DeviceBuffer(std::size_t count) : n(count) {
    KVSIM_CUDA_CHECK(cudaMalloc(&ptr, std::max<std::size_t>(n, 1) * sizeof(T)));
    KVSIM_CUDA_CHECK(cudaMemset(ptr, 0, std::max<std::size_t>(n, 1) * sizeof(T)));
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  std::vector<T> host() const {
    std::vector<T> out(n);
    if (n) KVSIM_CUDA_CHECK(cudaMemcpy(out.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost));
    return out;
  }
};

// Whether and how large the benchmarks run: off, at their real sizes, or at --smoke's tiny sizes,
// which only show that the benchmark code runs (on the CPU emulator, or in seconds on a device);
// smoke figures mean nothing.
struct Bench {
  bool on = false, smoke = false;
  explicit operator bool() const { return on; }
  int reps(int n) const { return smoke ? 1 : n; }
  std::int64_t size(std::int64_t full, std::int64_t small) const { return smoke ? small : full; }
};

// Mean seconds per call of `fn` over `reps` calls after one warm-up call.
inline double seconds_of(const std::function<void()>& fn, int reps) {
  fn();
  KVSIM_CUDA_CHECK(cudaDeviceSynchronize());
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) fn();
  KVSIM_CUDA_CHECK(cudaDeviceSynchronize());
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
}

}  // namespace kvsim::gpu
