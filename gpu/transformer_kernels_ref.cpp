#include "gpu/transformer_kernels_ref.h"

#include <algorithm>
#include <cmath>

#include "core/half.h"

namespace kvsim::gpu {

namespace {

float half_at(const std::uint16_t* p, std::int64_t i) { return half_to_float(p[i]); }

// Logits to softmax weights, in place.
void softmax(std::vector<double>& logits) {
  if (logits.empty()) return;
  const double mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (double& x : logits) sum += (x = std::exp(x - mx));
  for (double& x : logits) x /= sum;
}

}  // namespace

void attend_rows_ref(const AttnShape& s, int kv, const float* q, const std::vector<double>& keys,
                     const std::vector<double>& values, std::int64_t n, float* out, float* weights,
                     std::int64_t stride) {
  const int d = s.head_dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> w(static_cast<std::size_t>(n));
  for (int h = kv * s.group(); h < (kv + 1) * s.group(); ++h) {
    for (std::int64_t m = 0; m < n; ++m) {
      double dot = 0;
      for (int x = 0; x < d; ++x) dot += static_cast<double>(q[h * d + x]) * keys[static_cast<std::size_t>(m * d + x)];
      w[static_cast<std::size_t>(m)] = dot * scale;
    }
    softmax(w);
    std::vector<double> o(static_cast<std::size_t>(d), 0.0);
    for (std::int64_t m = 0; m < n; ++m)
      for (int x = 0; x < d; ++x)
        o[static_cast<std::size_t>(x)] += w[static_cast<std::size_t>(m)] * values[static_cast<std::size_t>(m * d + x)];
    for (int x = 0; x < d; ++x) out[h * d + x] = static_cast<float>(o[static_cast<std::size_t>(x)]);
    if (weights)
      for (std::int64_t m = 0; m < stride; ++m)
        weights[h * stride + m] = m < n ? static_cast<float>(w[static_cast<std::size_t>(m)]) : 0.0f;
  }
}

void attend_kept_ref(const AttnShape& s, const float* q, const std::uint16_t* k, const std::uint16_t* v,
                     const std::int32_t* kept, const std::int32_t* counts, int max_kept, float* out, float* weights) {
  const int d = s.head_dim;
  for (int kv = 0; kv < s.n_kv_heads; ++kv) {
    const std::int64_t n = counts[kv], base = static_cast<std::int64_t>(kv) * s.capacity * d;
    const std::int32_t* idx = kept + static_cast<std::int64_t>(kv) * max_kept;
    std::vector<double> keys(static_cast<std::size_t>(n * d)), values(keys.size());
    for (std::int64_t m = 0; m < n; ++m)
      for (int x = 0; x < d; ++x) {
        const std::int64_t at = base + static_cast<std::int64_t>(idx[m]) * d + x;
        keys[static_cast<std::size_t>(m * d + x)] = half_at(k, at);
        values[static_cast<std::size_t>(m * d + x)] = half_at(v, at);
      }
    attend_rows_ref(s, kv, q, keys, values, n, out, weights, max_kept);
  }
}

std::vector<std::int32_t> every_row_kept(int kv_heads, int n) {
  std::vector<std::int32_t> kept(static_cast<std::size_t>(kv_heads) * static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < kept.size(); ++i) kept[i] = static_cast<std::int32_t>(i % static_cast<std::size_t>(n));
  return kept;
}

}  // namespace kvsim::gpu
