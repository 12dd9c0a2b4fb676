#pragma once
// PackedRows, geometries and plans the packed-cache tests share (tests/test_packed_kv.cpp: what each
// codec stores; tests/test_gpu_ref.cpp: the device's row table over the same codec output).
#include <cstdint>
#include <random>
#include <vector>

#include "core/half.h"
#include "policies/policy.h"

namespace kvsim::test {

inline ModelGeometry geometry(int d, RopeType type = RopeType::Norm) {
  ModelGeometry g;
  g.n_layers = 1;
  g.n_q_heads = 2;
  g.n_kv_heads = 1;
  g.head_dim = d;
  g.rope = RopeSpec{type, d, d, 10000.0};
  return g;
}

// n rows of fp16 values with an outlier channel (as real keys have) and positions 3, 5, 7, ...
struct PackedRows {
  std::vector<float> k, v;
  std::vector<std::int32_t> pos;
};
inline PackedRows make_rows(const ModelGeometry& g, std::int64_t n, unsigned seed = 5) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  PackedRows r;
  const int d = g.head_dim;
  for (std::int64_t j = 0; j < n; ++j) {
    r.pos.push_back(static_cast<std::int32_t>(3 + 2 * j));
    for (int i = 0; i < d; ++i) {
      r.k.push_back(nd(rng) * (i == 3 ? 12.0f : 4.0f / static_cast<float>(1 + i % 8)));
      r.v.push_back(nd(rng));
    }
  }
  round_to_half(r.k.data(), r.k.size());
  round_to_half(r.v.data(), r.v.size());
  return r;
}

// The kept tokens' rows in cached order, as the engines hand them to a codec.
inline PackedRows kept_rows(const PackedRows& all, const HeadPlan& plan, int d) {
  PackedRows r;
  for (std::size_t j = 0; j < plan.codec.size(); ++j) {
    if (plan.codec[j] == TokenCodec::Drop) continue;
    r.k.insert(r.k.end(), all.k.begin() + static_cast<std::ptrdiff_t>(j * d),
               all.k.begin() + static_cast<std::ptrdiff_t>((j + 1) * d));
    r.v.insert(r.v.end(), all.v.begin() + static_cast<std::ptrdiff_t>(j * d),
               all.v.begin() + static_cast<std::ptrdiff_t>((j + 1) * d));
    r.pos.push_back(all.pos[j]);
  }
  return r;
}

// Every fifth token dropped, every third (of the rest) fp16, the others `encoded`.
inline HeadPlan mixed_plan(std::int64_t n, TokenCodec encoded) {
  HeadPlan p;
  for (std::int64_t j = 0; j < n; ++j)
    p.codec.push_back(j % 5 == 1 ? TokenCodec::Drop : j % 3 == 0 ? TokenCodec::Fp16 : encoded);
  return p;
}

}  // namespace kvsim::test
