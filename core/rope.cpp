#include "core/rope.h"

#include <algorithm>
#include <cmath>

namespace kvsim {

double rope_frequency(const RopeSpec& s, int i) {
  return std::pow(s.theta, -2.0 * static_cast<double>(i) / static_cast<double>(s.rope_dim));
}

void apply_rope(const RopeSpec& s, float* x, int n_heads, std::int64_t pos, bool inverse) {
  const int pairs = s.rope_dim / 2;
  const double sign = inverse ? -1.0 : 1.0;
  for (int i = 0; i < pairs; ++i) {
    const double angle = sign * static_cast<double>(pos) * rope_frequency(s, i);
    const auto c = static_cast<float>(std::cos(angle));
    const auto sn = static_cast<float>(std::sin(angle));
    const int a = rope_pair_first(s, i), b = rope_pair_second(s, i);
    for (int h = 0; h < n_heads; ++h) {
      float* v = x + static_cast<std::int64_t>(h) * s.head_dim;
      const float x0 = v[a], x1 = v[b];
      v[a] = x0 * c - x1 * sn;
      v[b] = x0 * sn + x1 * c;
    }
  }
}

void RopeTable::apply(float* x, int n_heads, std::int64_t pos, bool inverse) {
  const int pairs = spec_.rope_dim / 2;
  if (pos >= rows_) {
    const std::int64_t rows = std::max<std::int64_t>(pos + 1, 2 * rows_);
    cos_.resize(static_cast<std::size_t>(rows * pairs));
    sin_.resize(cos_.size());
    for (std::int64_t p = rows_; p < rows; ++p)
      for (int i = 0; i < pairs; ++i) {
        const double angle = static_cast<double>(p) * rope_frequency(spec_, i);
        cos_[static_cast<std::size_t>(p * pairs + i)] = static_cast<float>(std::cos(angle));
        sin_[static_cast<std::size_t>(p * pairs + i)] = static_cast<float>(std::sin(angle));
      }
    rows_ = rows;
  }
  // cos(-a) = cos(a) and sin(-a) = -sin(a) exactly, so the inverse matches apply_rope's too.
  const float* cs = cos_.data() + pos * pairs;
  const float* sn = sin_.data() + pos * pairs;
  for (int i = 0; i < pairs; ++i) {
    const float c = cs[i], s = inverse ? -sn[i] : sn[i];
    const int a = rope_pair_first(spec_, i), b = rope_pair_second(spec_, i);
    for (int h = 0; h < n_heads; ++h) {
      float* v = x + static_cast<std::int64_t>(h) * spec_.head_dim;
      const float x0 = v[a], x1 = v[b];
      v[a] = x0 * c - x1 * s;
      v[b] = x0 * s + x1 * c;
    }
  }
}

}  // namespace kvsim
