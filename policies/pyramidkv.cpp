// PyramidKV — Cai et al., "PyramidKV: Dynamic KV Cache Compression based on Pyramidal
// Information Funneling", arXiv 2406.02069 (KVCache-Factory pyramidkv_utils.py PyramidKVCluster).
// Rule: SnapKV scores, with a budget that decreases arithmetically from the lowest layer to the
// highest at the same mean.
#include <algorithm>

#include "core/error.h"
#include "policies/registry.h"
#include "policies/snapkv.h"

namespace kvsim {
namespace {

class PyramidKv : public ScoringPolicy {
 public:
  PyramidKv(SnapKvOptions o, std::int64_t beta) : o_(o), beta_(beta) {}
  std::vector<HeadScores> score(const LayerSignals& s) const override { return snapkv_scores(s, o_); }
  bool selection_is_uniform() const override { return false; }
  double state_bytes_per_head() const override { return 4.0; }  // layers differ in length: a length table

  // KVCache-Factory's integer arithmetic for cap_l; the window comes on top of it.
  LayerPlan compress(const LayerSignals& s, const Budget& budget) const override {
    // Layer budgets from the tokens seen, the same in every layer (not from a layer's own cache
    // size, which earlier chunk cuts made differ): their sum then stays within L x budget.
    const std::int64_t n = s.n_tokens();
    const std::int64_t w = o_.window, L = s.geometry().n_layers, B = budget.tokens;
    const std::int64_t base = B - w;
    Budget layer_budget = budget;
    if (n > B && base > 0 && n >= 2 * base && L > 1) {
      std::int64_t min_num = base / beta_;
      std::int64_t max_num = 2 * base - min_num;
      if (max_num >= n - w) {
        max_num = n - w;
        min_num = 2 * base - max_num;
      }
      const std::int64_t step = (max_num - min_num) / (L - 1);
      // The floored step makes the reference's layers sum to more than L x (budget - window)
      // (by up to L(L-1)/2 tokens); spread the excess over the layers, lowest first, so the
      // bytes never exceed the budget.
      const std::int64_t total = L * max_num - step * L * (L - 1) / 2;
      const std::int64_t excess = std::max<std::int64_t>(0, total - L * base);
      const std::int64_t trim = excess / L + (s.layer() < excess % L ? 1 : 0);
      layer_budget.tokens = max_num - s.layer() * step + w - trim;
    }
    return select_uniform(cached_score(s), layer_budget, s.geometry().n_kv_heads);
  }

 private:
  SnapKvOptions o_;
  std::int64_t beta_;
};

}  // namespace

KVSIM_REGISTER_POLICY(PolicyInfo{
    "pyramidkv", "SnapKV scores with a layer budget pyramid (more in low layers, same mean; prefill one-shot)",
    "Cai et al., arXiv 2406.02069",
    [] {
      auto specs = snapkv_param_specs();
      specs.push_back({"beta", "20", "pyramid steepness: the top layer keeps (budget - window) / beta"});
      return specs;
    }(),
    [](const Params& p) {
      const std::int64_t beta = p.integer("beta");
      if (beta < 1) throw Error("policy pyramidkv: parameter 'beta' = " + std::to_string(beta) + ", expected >= 1");
      return std::make_unique<PyramidKv>(snapkv_options(p), beta);
    }});

}  // namespace kvsim
