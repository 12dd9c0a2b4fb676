// Quantized-tier codecs: reconstruction error within the bound each bit width allows, byte counts
// against methods.md §12's worked figures, KIVI's residual window left exact.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "policies/quantize.h"

using namespace kvsim;

namespace {

std::vector<float> gaussian(std::size_t n, std::uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

constexpr double kHalfEps = 1.0 / 2048;  // fp16 relative rounding of the stored scale and min

}  // namespace

TEST_CASE("per-token intN stays within half a step (plus fp16 scale rounding)", "[quantize]") {
  const int d = 128;
  for (const int bits : {2, 4, 8}) {
    for (const int group : {32, 64, 128}) {
      for (const bool sym : {false, true}) {
        INFO(bits << "-bit, group " << group << (sym ? ", symmetric" : ", asymmetric"));
        const IntSpec s{bits, group, sym};
        const auto x = gaussian(d, static_cast<std::uint32_t>(bits * 1000 + group + sym));
        auto y = x;
        int_roundtrip(s, y);
        for (int g0 = 0; g0 < d; g0 += group) {
          float lo = x[static_cast<std::size_t>(g0)], hi = lo, amax = 0;
          for (int i = g0; i < g0 + group; ++i) {
            lo = std::min(lo, x[static_cast<std::size_t>(i)]);
            hi = std::max(hi, x[static_cast<std::size_t>(i)]);
            amax = std::max(amax, std::abs(x[static_cast<std::size_t>(i)]));
          }
          const double levels = sym ? (1 << (bits - 1)) - 1 : (1 << bits) - 1;
          const double step = sym ? amax / levels : (hi - lo) / levels;
          const double bound = step * (0.5 + levels * kHalfEps) + (sym ? 0.0 : std::abs(lo) * kHalfEps) + 1e-6;
          for (int i = g0; i < g0 + group; ++i)
            CHECK(std::abs(y[static_cast<std::size_t>(i)] - x[static_cast<std::size_t>(i)]) <= bound);
        }
      }
    }
  }
  // More bits, less error.
  double prev = 1e30;
  for (const int bits : {2, 4, 8}) {
    const auto x = gaussian(4096, 5);
    auto y = x;
    for (std::size_t r = 0; r < x.size(); r += d) int_roundtrip(IntSpec{bits, 32, false}, std::span(y).subspan(r, d));
    double mse = 0;
    for (std::size_t i = 0; i < x.size(); ++i) mse += (y[i] - x[i]) * (y[i] - x[i]);
    CHECK(mse < prev / 10);
    prev = mse;
  }
}

TEST_CASE("quantized bytes match the worked figures of methods.md §12", "[quantize]") {
  // KIVI, d = 128, 2-bit, G = 32: K 32 + 16 = 48 B, V 48 B per quantized token; G = 128: 36 + 36.
  CHECK(kivi_bytes(KiviSpec{2, 32, 0}, 128, 64) == 64 * 96.0);
  CHECK(kivi_bytes(KiviSpec{2, 128, 0}, 128, 128) == 128 * 72.0);
  // With the residual: 64 tokens, R = 32 -> every key quantized (64 mod 32 = 0), the last 32
  // values in fp16 (256 B each).
  CHECK(kivi_fp16_keys(KiviSpec{2, 32, 32}, 64) == 0);
  CHECK(kivi_fp16_values(KiviSpec{2, 32, 32}, 64) == 32);
  CHECK(kivi_bytes(KiviSpec{2, 32, 32}, 128, 64) == 64 * 48.0 + 32 * 48.0 + 32 * 256.0);
  CHECK(kivi_fp16_keys(KiviSpec{2, 32, 32}, 70) == 6);
  // No residual window: a partial key group (70 mod 32) has no statistics yet and stays fp16.
  CHECK(kivi_fp16_keys(KiviSpec{2, 32, 0}, 70) == 6);
  CHECK(kivi_fp16_values(KiviSpec{2, 32, 0}, 70) == 0);
  // Per-token intN: d/8 * bits + groups * (4 asymmetric | 2 symmetric).
  CHECK(int_row_bytes(IntSpec{4, 64, false}, 128) == 64 + 2 * 4);
  CHECK(int_row_bytes(IntSpec{2, 32, true}, 128) == 32 + 4 * 2);
  CHECK(int_row_bytes(IntSpec{8, 64, false}, 64) == 64 + 4);
}

TEST_CASE("KIVI keeps its residual window exact and bounds the rest", "[quantize]") {
  const int d = 64;
  const KiviSpec s{2, 32, 32};
  const std::int64_t n = 100;  // keys: 96 quantized, 4 fp16; values: 68 quantized, 32 fp16
  const auto k = gaussian(static_cast<std::size_t>(n * d), 1), v = gaussian(static_cast<std::size_t>(n * d), 2);
  auto kh = k, vh = v;
  kivi_roundtrip(s, d, n, kh, vh);
  for (std::int64_t t = 96 * d; t < n * d; ++t)
    CHECK(kh[static_cast<std::size_t>(t)] == k[static_cast<std::size_t>(t)]);
  for (std::int64_t t = 68 * d; t < n * d; ++t)
    CHECK(vh[static_cast<std::size_t>(t)] == v[static_cast<std::size_t>(t)]);
  // Keys: per channel over groups of 32 tokens; 2 bits = 3 steps over the group's range.
  for (std::int64_t t0 = 0; t0 < 96; t0 += 32)
    for (int ch = 0; ch < d; ++ch) {
      float lo = 1e30f, hi = -1e30f;
      for (std::int64_t t = t0; t < t0 + 32; ++t) {
        lo = std::min(lo, k[static_cast<std::size_t>(t * d + ch)]);
        hi = std::max(hi, k[static_cast<std::size_t>(t * d + ch)]);
      }
      const double bound = (hi - lo) / 3.0 * (0.5 + 3 * kHalfEps) + std::abs(lo) * kHalfEps + 1e-6;
      for (std::int64_t t = t0; t < t0 + 32; ++t)
        CHECK(std::abs(kh[static_cast<std::size_t>(t * d + ch)] - k[static_cast<std::size_t>(t * d + ch)]) <= bound);
    }
  int changed = 0;
  for (std::int64_t t = 0; t < 68 * d; ++t)
    changed += vh[static_cast<std::size_t>(t)] != v[static_cast<std::size_t>(t)];
  CHECK(changed > 68 * d / 2);
}

TEST_CASE("quantizer specs are checked", "[quantize]") {
  CHECK_THROWS_WITH(check_int_spec(IntSpec{3, 32, false}, 64), Catch::Contains("bits = 3, expected 2, 4 or 8"));
  CHECK_THROWS_WITH(check_int_spec(IntSpec{4, 48, false}, 64),
                    Catch::Contains("group = 48 does not divide head_dim 64"));
  CHECK_THROWS_WITH(check_kivi_spec(KiviSpec{2, 32, 48}, 64),
                    Catch::Contains("residual = 48 is not a multiple of group 32"));
}
