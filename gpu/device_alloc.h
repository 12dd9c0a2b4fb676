#pragma once
// Stream-ordered device allocation where the driver has memory pools (cudaMallocAsync /
// cudaFreeAsync), and plain cudaMalloc / cudaFree where it has none: some virtualised GPUs report
// cudaDevAttrMemoryPoolsSupported = 0 and refuse the async calls with "operation not supported".
// cudaFree waits for the device, so the fallback keeps the stream order the callers rely on.
#include <cuda_runtime.h>

#include <cstddef>

namespace kvsim::gpu {

// Whether the current device has memory pools (asked once per device).
bool memory_pools_supported();

// `pooled` records which kind the allocation is; device_free must be given it back (the current
// device, or what it supports, may differ by then).
cudaError_t device_alloc(void** ptr, std::size_t bytes, cudaStream_t stream, bool& pooled);
cudaError_t device_free(void* ptr, cudaStream_t stream, bool pooled);

}  // namespace kvsim::gpu
