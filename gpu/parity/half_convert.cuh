#pragma once
// f16 -> f32 widening on the device: a device check, not a product kernel (the backend's kernels
// convert with the same intrinsics inline). It proves the toolchain end to end and that the
// device rounds as core/half.h does (gpu.half_parity compares all 65536 halves).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace kvsim::gpu {

// dst[i] = float(src[i]) for i < n; device pointers; asynchronous on `stream`.
cudaError_t halves_to_floats(const std::uint16_t* src, float* dst, std::size_t n, cudaStream_t stream);

// Number of usable CUDA devices (0 when there is no driver or no GPU).
int device_count();

}  // namespace kvsim::gpu
