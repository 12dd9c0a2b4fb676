#include "gpu/random_packed.h"

#include <vector>

#include "core/half.h"

namespace kvsim::gpu {

namespace {

std::vector<std::uint16_t> gaussian_halves(std::size_t n, std::mt19937& rng, float scale) {
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<std::uint16_t> h(n);
  for (auto& x : h) x = float_to_half(nd(rng));
  return h;
}

}  // namespace

PackedTensor random_packed(int d, std::int64_t n, int bits, int span, bool symmetric, bool rotate, std::mt19937& rng,
                           std::int32_t first_position) {
  PackedTensor t;
  t.bits = bits, t.param_span = span, t.symmetric = symmetric, t.rotate = rotate;
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.01f, 0.2f), mn(-1.0f, 0.0f);
  t.basis = gaussian_halves(static_cast<std::size_t>(d * d), rng, 0.125f);
  for (std::int64_t m = 0; m < n; ++m) {
    PackedRow r;
    r.position = first_position + static_cast<std::int32_t>(m);
    if (m % 3 == 0) {
      std::vector<float> x(static_cast<std::size_t>(d));
      std::normal_distribution<float> nd;
      for (auto& v : x) v = nd(rng);
      pack_fp16_row(t, x.data(), d, r.position);
      continue;
    }
    if (m % 3 == 1) {
      r.kind = PackedKind::Quant;
      r.data = static_cast<std::int64_t>(t.codes.size());
      r.param = static_cast<std::int64_t>(t.params.size() / 2);
      for (int b = 0; b < d * bits / 8; ++b) t.codes.push_back(static_cast<std::uint8_t>(byte(rng)));
      for (int g = 0; g < d / span; ++g) {
        t.params.push_back(float_to_half(scale(rng)));
        t.params.push_back(float_to_half(symmetric ? 0.0f : mn(rng)));
      }
    } else {
      r.kind = PackedKind::LowRank;
      r.rank = static_cast<std::uint16_t>(1 + m % d);
      r.data = static_cast<std::int64_t>(t.halves.size());
      const auto c = gaussian_halves(r.rank, rng, 1.0f);
      t.halves.insert(t.halves.end(), c.begin(), c.end());
    }
    t.rows.push_back(r);
  }
  return t;
}

}  // namespace kvsim::gpu
