#pragma once
// Low-rank K/V storage (methods.md §10.b, §11): per (layer, KV head) orthonormal bases of the
// pre-RoPE keys and of the values, fitted on the request's own cached tokens (training-free);
// each token keeps the first r_j coefficients of its key and value in those bases (fp16),
// nested so rank r is a prefix of rank r + 1. Keys are un-rotated with their positions before
// projecting and rotated again after reconstructing, since RoPE mixes the basis directions.
#include <cstdint>
#include <span>
#include <vector>

#include "policies/codec.h"
#include "policies/policy.h"

namespace kvsim {

struct HeadBasis {
  int d = 0;
  std::vector<float> uk, uv;  // [d, d] row-major, column r = r-th principal direction (fp16 values)
};

// Bases from n tokens' post-RoPE keys and values ([n, d] row-major) at `positions`; with ck/cv,
// also every token's coefficients in them ([n, d] each, fp16 values, keys un-rotated first).
HeadBasis fit_basis(const KvGeometry& g, std::span<const float> keys, std::span<const float> values,
                    std::span<const std::int32_t> positions, std::vector<float>* ck = nullptr, std::vector<float>* cv = nullptr);

// Bytes of one (layer, KV head) cache under a low-rank plan: per LowRank token r coefficients for
// K and for V (fp16) + 1 rank byte, fp16 tokens at full size, plus both fp16 d x d bases.
double lowrank_bytes(const HeadPlan& plan, int head_dim);

class LowRankCodec : public KvCodec {
 public:
  double bytes(const HeadPlan& plan, int head_dim) const override { return lowrank_bytes(plan, head_dim); }
  void reconstruct(const HeadPlan& plan, const KvGeometry& g, std::span<const std::int32_t> positions, std::span<float> keys,
                   std::span<float> values) const override;
};

}  // namespace kvsim
