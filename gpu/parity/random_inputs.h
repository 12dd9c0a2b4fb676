#pragma once
// Random inputs for the kernels' checks (the parity harness, its CPU tests, the emulated kernel
// tests, gpu/parity/random_packed.h). CUDA-free.
#include <cstdint>
#include <random>
#include <vector>

#include "core/half.h"

namespace kvsim::gpu {

inline std::vector<float> gaussian(std::size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

inline std::vector<float> gaussian(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  return gaussian(n, rng);
}

// x as fp16 bits.
inline std::vector<std::uint16_t> halves(const std::vector<float>& x) {
  std::vector<std::uint16_t> h(x.size());
  floats_to_halves(x.data(), h.data(), x.size());
  return h;
}

}  // namespace kvsim::gpu
