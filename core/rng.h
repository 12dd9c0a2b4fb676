#pragma once
// The project's seeded random numbers. mt19937_64's output sequence is fixed by the standard;
// the distributions on top are ours (std:: ones differ between standard libraries), so a seed
// means the same run everywhere. Streams are derived from (seed, a, b, c, d) with SplitMix64.
#include <cmath>
#include <cstdint>
#include <numbers>
#include <random>

namespace kvsim {

inline std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

class Rng {
 public:
  explicit Rng(std::uint64_t seed, std::uint64_t a = 0, std::uint64_t b = 0, std::uint64_t c = 0, std::uint64_t d = 0)
      : gen_(splitmix64(splitmix64(splitmix64(splitmix64(seed ^ splitmix64(a)) ^ b) ^ c) ^ d)) {}
  double uniform() { return static_cast<double>(gen_() >> 11) * 0x1.0p-53; }  // [0, 1)
  std::uint64_t below(std::uint64_t n) { return gen_() % n; }                 // n << 2^64: bias negligible
  double normal() {                                                           // Box-Muller, one spare kept
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u1 = uniform();
    while (u1 <= 0.0) u1 = uniform();
    const double u2 = uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = r * std::sin(2.0 * std::numbers::pi * u2);
    has_spare_ = true;
    return r * std::cos(2.0 * std::numbers::pi * u2);
  }

 private:
  std::mt19937_64 gen_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

}  // namespace kvsim
