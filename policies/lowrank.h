#pragma once
// Low-rank K/V storage (methods.md §10.b, §11): per (layer, KV head) orthonormal bases of the
// pre-RoPE keys and of the values, fitted on the request's own cached tokens (training-free) or
// on calibration traces (policies/basis_set.h);
// each token keeps the first r_j coefficients of its key and value in those bases (fp16),
// nested so rank r is a prefix of rank r + 1. Keys are un-rotated with their positions before
// projecting and rotated again after reconstructing, since RoPE mixes the basis directions.
#include <cstdint>
#include <memory>
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
HeadBasis fit_basis(const ModelGeometry& g, std::span<const float> keys, std::span<const float> values,
                    std::span<const std::int32_t> positions, std::vector<float>* ck = nullptr,
                    std::vector<float>* cv = nullptr);

// Second moments of pre-RoPE keys and of values over calibration tokens, for bases that are
// fitted once on calibration traces and reused for every request.
struct GramAccumulator {
  int d = 0;
  std::vector<double> kk, vv;  // [d, d]
  std::int64_t tokens = 0;
  // Adds n tokens' post-RoPE keys and values ([n, d]) at `positions`.
  void add(const ModelGeometry& g, std::span<const float> keys, std::span<const float> values,
           std::span<const std::int32_t> positions);
  HeadBasis basis() const;  // principal directions, decreasing eigenvalue, fp16 values
};

// What one (layer, KV head)'s bases cost a request (docs/policies.md, "Low-rank bytes"): a basis
// fitted on the request stores only the directions its ranks use, d x r_max fp16 for keys and
// again for values; a calibration basis is held once, whole (2 x d x d fp16), and its bytes are
// amortised over the `serves` requests it serves.
struct BasisCharge {
  bool shared = false;
  double serves = 1;
  double bytes(int d, int r_max) const {
    if (r_max <= 0) return 0.0;
    return shared ? 4.0 * d * d / serves : 4.0 * d * r_max;
  }
};

// A low-rank fit of one (layer, KV head) cache at a compression point: the bases and every cached
// token's coefficients, computed once and handed to the codec with the plan (HeadPlan::data).
struct LowRankFit : CodecData {
  HeadBasis basis;
  std::vector<float> ck, cv;  // [n, d] coefficients of the n cached tokens, cached order (fp16 values)
  std::int64_t n = 0;
  BasisCharge charge;
};

// Fits bases on the given tokens (training-free), or, with `fixed`, projects onto those
// (calibration bases).
std::shared_ptr<const LowRankFit> fit_lowrank(const ModelGeometry& g, std::span<const float> keys,
                                              std::span<const float> values, std::span<const std::int32_t> positions,
                                              const HeadBasis* fixed = nullptr);

struct BasisSet;  // policies/basis_set.h
// Every KV head's fit of one layer on all its cached tokens (calibration bases when given),
// memoised per layer and basis source, so every budget and every low-rank policy shares them.
std::vector<std::shared_ptr<const LowRankFit>> layer_fits(const LayerSignals& s,
                                                          const std::shared_ptr<const BasisSet>& calibration);

// Bytes of k low-rank tokens holding `coefficients` ranks in all (K and V each, fp16), one rank
// byte per token when their ranks differ (one rank for all is a constant), and the bases at
// `charge` for a highest rank r_max.
double lowrank_cost(std::int64_t k, double coefficients, bool ranks_differ, int r_max, int head_dim,
                    const BasisCharge& charge);

// Bytes of one (layer, KV head) cache under a low-rank plan: lowrank_cost of its LowRank tokens
// (the bases charged as the plan's fit says; a request's own without one) plus fp16 tokens.
double lowrank_bytes(const HeadPlan& plan, int head_dim);

class LowRankCodec : public KvCodec {
 public:
  double bytes(const HeadPlan& plan, int head_dim) const override { return lowrank_bytes(plan, head_dim); }
  void reconstruct(const HeadPlan& plan, const ModelGeometry& g, std::span<const std::int32_t> positions,
                   std::span<float> keys, std::span<float> values) const override;
  int reconstruct_factored(const HeadPlan& plan, const ModelGeometry& g, std::span<const std::int32_t> positions,
                           std::span<float> keys, std::span<float> values,
                           std::span<const float>& basis) const override;
  bool reads_rows(const HeadPlan& plan) const override;
  void pack(const HeadPlan& plan, const ModelGeometry& g, std::span<const std::int32_t> positions,
            std::span<const float> keys, std::span<const float> values, PackedEntry& out) const override;

 private:
  int rebuild(const HeadPlan& plan, const ModelGeometry& g, std::span<const std::int32_t> positions,
              std::span<float> keys, std::span<float> values, std::span<const float>* basis) const;
};

}  // namespace kvsim
