#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/half.h"

using namespace kvsim;

TEST_CASE("half_to_float decodes the landmark values exactly", "[half]") {
  CHECK(half_to_float(0x3c00) == 1.0f);
  CHECK(half_to_float(0xc000) == -2.0f);
  CHECK(half_to_float(0x7bff) == 65504.0f);                  // largest finite
  CHECK(half_to_float(0x0400) == std::ldexp(1.0f, -14));     // smallest normal
  CHECK(half_to_float(0x0001) == std::ldexp(1.0f, -24));     // smallest subnormal
  CHECK(half_to_float(0x03ff) == std::ldexp(1023.0f, -24));  // largest subnormal
  CHECK(std::signbit(half_to_float(0x8000)));
  CHECK(half_to_float(0x8000) == 0.0f);
  CHECK(std::isinf(half_to_float(0x7c00)));
  CHECK(half_to_float(0xfc00) < 0);
  CHECK(std::isnan(half_to_float(0x7e00)));
  CHECK(std::isnan(half_to_float(0x7c01)));  // signalling NaN stays a NaN
}

TEST_CASE("every half survives half -> float -> half", "[half]") {
  for (std::uint32_t h = 0; h <= 0xffff; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    const float f = half_to_float(bits);
    const std::uint16_t back = float_to_half(f);
    if (std::isnan(f)) {
      REQUIRE((back & 0x7c00) == 0x7c00);
      REQUIRE((back & 0x03ff) != 0);
      REQUIRE((back & 0x8000) == (bits & 0x8000));
    } else {
      REQUIRE(back == bits);
    }
  }
}

TEST_CASE("float_to_half rounds to nearest even and saturates to inf", "[half]") {
  // 1 + 2^-11 is exactly halfway between 1 and the next half: ties to even (1.0).
  CHECK(float_to_half(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);
  // 1 + 3*2^-11 is halfway between 1+2^-10 (odd) and 1+2^-9: ties to even (up).
  CHECK(float_to_half(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);
  CHECK(float_to_half(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)) == 0x3c01);
  CHECK(float_to_half(65504.0f) == 0x7bff);
  CHECK(float_to_half(65519.0f) == 0x7bff);  // below the rounding boundary
  CHECK(float_to_half(65520.0f) == 0x7c00);  // rounds up to inf
  CHECK(float_to_half(1e9f) == 0x7c00);
  CHECK(float_to_half(-1e9f) == 0xfc00);
  CHECK(float_to_half(std::numeric_limits<float>::infinity()) == 0x7c00);
  // Subnormal results: 2^-24 is the smallest; half of it ties to even (zero), a bit more rounds up.
  CHECK(float_to_half(std::ldexp(1.0f, -24)) == 0x0001);
  CHECK(float_to_half(std::ldexp(1.0f, -25)) == 0x0000);
  CHECK(float_to_half(std::ldexp(1.5f, -25)) == 0x0001);
  CHECK(float_to_half(std::ldexp(3.0f, -25)) == 0x0002);  // 1.5 subnormal ulps: tie to even (2)
  CHECK(float_to_half(-std::ldexp(1.0f, -30)) == 0x8000);
  CHECK(float_to_half(std::ldexp(1023.5f, -24)) == 0x0400);  // rounds up into the normals
}

TEST_CASE("vectorised conversions agree bit for bit with the scalar ones", "[half]") {
  INFO("F16C available: " << half_simd_available());
  std::vector<std::uint16_t> all(65536 + 5);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::uint16_t>(i * 40503u);
  for (std::uint32_t h = 0; h <= 0xffff; ++h) all[h] = static_cast<std::uint16_t>(h);
  std::vector<float> fast(all.size()), slow(all.size());
  halves_to_floats(all.data(), fast.data(), all.size());
  halves_to_floats_scalar(all.data(), slow.data(), all.size());
  REQUIRE(std::memcmp(fast.data(), slow.data(), fast.size() * sizeof(float)) == 0);

  std::mt19937 gen(3);
  std::vector<float> floats;
  for (int i = 0; i < 200000; ++i) floats.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(gen())));
  for (float f : {0.0f, -0.0f, 65504.0f, 65520.0f, 6e-8f, 3e-8f, std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN()})
    floats.push_back(f);
  std::vector<std::uint16_t> a(floats.size()), b(floats.size());
  floats_to_halves(floats.data(), a.data(), floats.size());
  floats_to_halves_scalar(floats.data(), b.data(), floats.size());
  REQUIRE(a == b);
}
