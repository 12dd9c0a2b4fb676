#pragma once
// The parity checks' value metric.
#include <vector>

namespace kvsim::gpu {

// Normalised mean squared error ||a - b||^2 / ||b||^2 (b the reference); infinite (a failure at
// any limit) when the sizes differ or there is nothing to compare.
double nmse(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace kvsim::gpu
