#pragma once
// CUB's segmented sort as tests/cuda_emu needs it: each segment's pairs by key, descending.
#include <algorithm>
#include <cstddef>
#include <numeric>
#include <vector>

#include "cuda_runtime.h"

namespace cub {
struct DeviceSegmentedSort {
  template <class K, class V, class O>
  static cudaError_t SortPairsDescending(void* temp, std::size_t& temp_bytes, const K* keys_in, K* keys_out,
                                         const V* values_in, V* values_out, int items, int segments, const O* begin,
                                         const O* end, cudaStream_t) {
    if (!temp) {  // the size query
      temp_bytes = 1;
      return cudaSuccess;
    }
    for (int s = 0; s < segments; ++s) {
      std::vector<int> order(static_cast<std::size_t>(end[s] - begin[s]));
      std::iota(order.begin(), order.end(), static_cast<int>(begin[s]));
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return keys_in[a] > keys_in[b]; });
      for (std::size_t i = 0; i < order.size(); ++i) {
        keys_out[begin[s] + static_cast<O>(i)] = keys_in[order[i]];
        values_out[begin[s] + static_cast<O>(i)] = values_in[order[i]];
      }
    }
    (void)items;
    return cudaSuccess;
  }
};
}  // namespace cub
