#include "gpu/device_alloc.h"

#include <mutex>
#include <vector>

namespace kvsim::gpu {

bool memory_pools_supported() {
  static std::mutex mu;
  static std::vector<int> known;  // per device: -1 not asked yet, else the attribute
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  const std::lock_guard<std::mutex> lock(mu);
  if (known.size() <= static_cast<std::size_t>(dev)) known.resize(static_cast<std::size_t>(dev) + 1, -1);
  int& k = known[static_cast<std::size_t>(dev)];
  if (k < 0) {
    int pools = 0;
    k = cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, dev) == cudaSuccess && pools != 0;
  }
  return k != 0;
}

cudaError_t device_alloc(void** ptr, std::size_t bytes, cudaStream_t stream, bool& pooled) {
  pooled = memory_pools_supported();
  return pooled ? cudaMallocAsync(ptr, bytes, stream) : cudaMalloc(ptr, bytes);
}

cudaError_t device_free(void* ptr, cudaStream_t stream, bool pooled) {
  return pooled ? cudaFreeAsync(ptr, stream) : cudaFree(ptr);
}

}  // namespace kvsim::gpu
