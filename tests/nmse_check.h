#pragma once
// Normalised mean squared error of `got` against `want`, for tests holding one forward pass
// against another (sizes must agree).
#include <catch2/catch.hpp>

#include <span>

namespace kvsim::test {

inline double nmse(std::span<const float> got, std::span<const float> want) {
  REQUIRE(got.size() == want.size());
  double err = 0, ref = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double e = static_cast<double>(got[i]) - want[i];
    err += e * e;
    ref += static_cast<double>(want[i]) * want[i];
  }
  return ref > 0 ? err / ref : err;
}

}  // namespace kvsim::test
