#include <catch2/catch.hpp>

#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "core/rope.h"

using namespace kvsim;

namespace {
std::vector<float> random_vec(int n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist;
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = dist(gen);
  return v;
}
float dot(const std::vector<float>& a, const std::vector<float>& b) {
  return std::inner_product(a.begin(), a.end(), b.begin(), 0.0f);
}
}  // namespace

TEST_CASE("RoPE inverse recovers pre-RoPE vectors for both pairings", "[rope]") {
  for (RopeType type : {RopeType::Norm, RopeType::Neox}) {
    const RopeSpec spec{type, 16, 16, 10000.0};
    auto x = random_vec(32, 1);  // two heads
    const auto orig = x;
    apply_rope(spec, x.data(), 2, 1234);
    CHECK(x != orig);
    apply_rope(spec, x.data(), 2, 1234, true);
    for (std::size_t i = 0; i < x.size(); ++i) CHECK(x[i] == Approx(orig[i]).margin(1e-4));
  }
}

TEST_CASE("RoPE pairs adjacent dims (norm) or half-offset dims (neox)", "[rope]") {
  const RopeSpec norm{RopeType::Norm, 8, 8, 10000.0};
  const RopeSpec neox{RopeType::Neox, 8, 8, 10000.0};
  // A unit vector on dim 0 at position 1 rotates by angle 1 (pair 0 has frequency 1) into
  // dim 1 for norm pairing and into dim 4 for neox pairing.
  std::vector<float> a(8, 0.0f), b(8, 0.0f);
  a[0] = b[0] = 1.0f;
  apply_rope(norm, a.data(), 1, 1);
  apply_rope(neox, b.data(), 1, 1);
  CHECK(a[0] == Approx(std::cos(1.0)));
  CHECK(a[1] == Approx(std::sin(1.0)));
  CHECK(a[4] == 0.0f);
  CHECK(b[4] == Approx(std::sin(1.0)));
  CHECK(b[1] == 0.0f);
}

TEST_CASE("post-RoPE q.k depends only on the distance", "[rope]") {
  const RopeSpec spec{RopeType::Norm, 16, 16, 100000.0};
  const auto q0 = random_vec(16, 2), k0 = random_vec(16, 3);
  auto score = [&](int pq, int pk) {
    auto q = q0, k = k0;
    apply_rope(spec, q.data(), 1, pq);
    apply_rope(spec, k.data(), 1, pk);
    return dot(q, k);
  };
  CHECK(score(10, 3) == Approx(score(107, 100)).margin(1e-3));
  CHECK(score(5, 5) == Approx(dot(q0, k0)).margin(1e-4));
}

TEST_CASE("dims past rope_dim pass through unrotated", "[rope]") {
  const RopeSpec spec{RopeType::Neox, 8, 4, 10000.0};
  auto x = random_vec(8, 4);
  const auto orig = x;
  apply_rope(spec, x.data(), 1, 99);
  for (int i = 4; i < 8; ++i) CHECK(x[static_cast<std::size_t>(i)] == orig[static_cast<std::size_t>(i)]);
}

TEST_CASE("RopeTable rotates exactly as apply_rope, forward and inverse, both pairings", "[rope]") {
  for (const RopeType type : {RopeType::Norm, RopeType::Neox}) {
    RopeTable table(RopeSpec{type, 64, 64, 100000.0});
    for (const std::int64_t pos : {0L, 7L, 300L, 4095L, 5L}) {
      for (const bool inverse : {false, true}) {
        std::vector<float> a(128), b;
        for (std::size_t i = 0; i < a.size(); ++i)
          a[i] = std::sin(0.37f * static_cast<float>(i) + 0.1f * static_cast<float>(pos));
        b = a;
        apply_rope(table.spec(), a.data(), 2, pos, inverse);
        table.apply(b.data(), 2, pos, inverse);
        CHECK(a == b);
      }
    }
  }
}
