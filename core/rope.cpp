#include "core/rope.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"

namespace kvsim {

double rope_frequency(const RopeSpec& s, int i) {
  return std::pow(s.theta, -2.0 * static_cast<double>(i) / static_cast<double>(s.rope_dim));
}

namespace {

// Rotates each pair i of n_heads vectors by the angle whose cosine and sine are c[i], sn[i].
// The pairing is resolved outside the loops so that the inner one vectorises (low-rank replay
// rotates every reconstructed key; same arithmetic per element as a per-pair loop).
void rotate_pairs(const RopeSpec& s, float* x, int n_heads, const float* c, const float* sn, bool inverse) {
  const int pairs = s.rope_dim / 2;
  const float sign = inverse ? -1.0f : 1.0f;
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + static_cast<std::int64_t>(h) * s.head_dim;
    if (s.type == RopeType::Neox) {
      float* lo = v;
      float* hi = v + pairs;
      for (int i = 0; i < pairs; ++i) {
        const float ci = c[i], si = sign * sn[i], x0 = lo[i], x1 = hi[i];
        lo[i] = x0 * ci - x1 * si;
        hi[i] = x0 * si + x1 * ci;
      }
    } else {
      for (int i = 0; i < pairs; ++i) {
        const float ci = c[i], si = sign * sn[i], x0 = v[2 * i], x1 = v[2 * i + 1];
        v[2 * i] = x0 * ci - x1 * si;
        v[2 * i + 1] = x0 * si + x1 * ci;
      }
    }
  }
}

void angles(const RopeSpec& s, std::int64_t pos, float* c, float* sn) {
  for (int i = 0; i < s.rope_dim / 2; ++i) {
    const double angle = static_cast<double>(pos) * rope_frequency(s, i);
    c[i] = static_cast<float>(std::cos(angle));
    sn[i] = static_cast<float>(std::sin(angle));
  }
}

}  // namespace

// cos(-a) = cos(a) and sin(-a) = -sin(a) exactly, so the inverse negates the sine.
void apply_rope(const RopeSpec& s, float* x, int n_heads, std::int64_t pos, bool inverse) {
  // On the engine's per-token path: no allocation (head_dim <= 1024 covers every model we know).
  constexpr int kMaxPairs = 512;
  if (s.rope_dim / 2 > kMaxPairs) throw Error("rope: rope_dim " + std::to_string(s.rope_dim) + " over 1024");
  float c[kMaxPairs], sn[kMaxPairs];
  angles(s, pos, c, sn);
  rotate_pairs(s, x, n_heads, c, sn, inverse);
}

void RopeTable::apply(float* x, int n_heads, std::int64_t pos, bool inverse) {
  const int pairs = spec_.rope_dim / 2;
  if (pos >= rows_) {
    const std::int64_t rows = std::max<std::int64_t>(pos + 1, 2 * rows_);
    cos_.resize(static_cast<std::size_t>(rows * pairs));
    sin_.resize(cos_.size());
    for (std::int64_t p = rows_; p < rows; ++p) angles(spec_, p, cos_.data() + p * pairs, sin_.data() + p * pairs);
    rows_ = rows;
  }
  rotate_pairs(spec_, x, n_heads, cos_.data() + pos * pairs, sin_.data() + pos * pairs, inverse);
}

}  // namespace kvsim
