// Ada-KV — Feng et al., "Ada-KV: Optimizing KV Cache Eviction by Adaptive Budget Allocation for
// Efficient LLM Inference", NeurIPS 2025 (FFY0/AdaKV AdaptiveSnapKVCluster).
// Rule: share a layer's budget across its KV heads by a global top-k over their scores, with a
// floor of alpha times the uniform share; wraps any scoring policy.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "policies/base_scorer.h"
#include "policies/registry.h"
#include "policies/selection.h"

namespace kvsim {
namespace {

class AdaKv : public Policy {
 public:
  AdaKv(std::unique_ptr<Policy> base, double alpha, bool normalize)
      : base_(std::move(base)), alpha_(alpha), normalize_(normalize) {}

  LayerPlan compress(const LayerSignals& s, const Budget& budget) const override {
    std::vector<HeadScores> scores = scorer().cached_score(s);  // a copy: normalize edits it
    const auto H = scores.size();  // plan entries: KV heads, or query heads (per_query_head)
    const std::int64_t per_entry = budget.tokens * s.geometry().n_kv_heads / static_cast<std::int64_t>(H);
    std::vector<std::int64_t> prot(H, 0), share(H, 0);
    for (std::size_t h = 0; h < H; ++h) {
      const auto& p = scores[h].protect;
      prot[h] = std::min<std::int64_t>(per_entry, std::accumulate(p.begin(), p.end(), std::int64_t{0}));
      share[h] = std::min(per_entry - prot[h], static_cast<std::int64_t>(scores[h].score.size()) - prot[h]);
    }
    if (normalize_) {  // scale each head by the share of its mass its own top-B' would keep
      for (std::size_t h = 0; h < H; ++h) {
        std::vector<float> free_scores;
        const auto n = static_cast<std::int64_t>(scores[h].score.size());
        for (std::int64_t j = 0; j < n; ++j)
          if (scores[h].protect.empty() || !scores[h].protect[static_cast<std::size_t>(j)])
            free_scores.push_back(scores[h].score[static_cast<std::size_t>(j)]);
        std::sort(free_scores.begin(), free_scores.end(), std::greater<>());
        const double total = std::accumulate(free_scores.begin(), free_scores.end(), 0.0);
        const double top = std::accumulate(free_scores.begin(), free_scores.begin() + share[h], 0.0);
        if (total > 0)
          for (auto& x : scores[h].score) x = static_cast<float>(x * (top / total));
      }
    }
    // Global top over the unprotected tokens of every head: n_h = how many each head wins.
    struct Cand {
      float score;
      std::int32_t head, j;
      std::int32_t token;  // what j holds: heads' caches may differ after earlier cuts
    };
    const int Hkv = s.geometry().n_kv_heads;
    auto token_of = [&](std::size_t h, std::int64_t j) {
      const int kv = static_cast<int>(H) == Hkv ? static_cast<int>(h) : static_cast<int>(h) / s.geometry().group();
      return s.cached(kv)[static_cast<std::size_t>(j)];
    };
    std::vector<Cand> cands;
    for (std::size_t h = 0; h < H; ++h)
      for (std::int64_t j = 0; j < static_cast<std::int64_t>(scores[h].score.size()); ++j)
        if (scores[h].protect.empty() || !scores[h].protect[static_cast<std::size_t>(j)])
          cands.push_back({scores[h].score[static_cast<std::size_t>(j)], static_cast<std::int32_t>(h),
                           static_cast<std::int32_t>(j), token_of(h, j)});
    const std::int64_t total = std::accumulate(share.begin(), share.end(), std::int64_t{0});
    const auto take = std::min<std::size_t>(static_cast<std::size_t>(total), cands.size());
    std::nth_element(cands.begin(), cands.begin() + static_cast<std::ptrdiff_t>(take), cands.end(),
                     [](const Cand& a, const Cand& b) {
                       if (a.score != b.score) return a.score > b.score;
                       if (a.token != b.token) return a.token > b.token;  // tie: the more recent token
                       return a.head < b.head;
                     });
    std::vector<std::int64_t> won(H, 0);
    for (std::size_t i = 0; i < take; ++i) ++won[static_cast<std::size_t>(cands[i].head)];
    // Floor blend, then trim rounding overshoot so the layer never exceeds its total.
    std::vector<std::int64_t> cap(H);
    for (std::size_t h = 0; h < H; ++h)
      cap[h] = std::min<std::int64_t>(
          static_cast<std::int64_t>(scores[h].score.size()) - prot[h],
          std::llround(static_cast<double>(won[h]) * (1 - alpha_) + alpha_ * static_cast<double>(share[h])));
    std::int64_t sum = std::accumulate(cap.begin(), cap.end(), std::int64_t{0});
    while (sum > total) {
      const auto h = static_cast<std::size_t>(std::max_element(cap.begin(), cap.end()) - cap.begin());
      --cap[h];
      --sum;
    }
    LayerPlan plan;
    for (std::size_t h = 0; h < H; ++h)
      plan.heads.push_back(plan_from_mask(top_k_mask(scores[h].score, prot[h] + cap[h], scores[h].protect)));
    return plan;
  }
  double state_bytes_per_token() const override { return base_->state_bytes_per_token(); }
  bool reads_future() const override { return base_->reads_future(); }
  double state_bytes_per_head() const override { return 4.0; }  // per-head lengths: the cache is ragged

 private:
  const ScoringPolicy& scorer() const { return static_cast<const ScoringPolicy&>(*base_); }
  std::unique_ptr<Policy> base_;
  double alpha_;
  bool normalize_;
};

}  // namespace

KVSIM_REGISTER_POLICY(PolicyInfo{
    "adakv",
    "head-adaptive budgets inside each layer over any scoring policy's scores (prefill one-shot)",
    "Feng et al., NeurIPS 2025, arXiv 2407.11550",
    {{"base", "snapkv",
      "one-shot scoring policy whose scores are re-allocated; its parameters follow '/': snapkv/window=64. "
      "Default snapkv uses its own defaults (kernel 5, avg); the AdaKV repo uses base=snapkv/kernel=7/pool=max"},
     {"alpha", "0.2", "floor: each head keeps at least alpha x its uniform share (repo GQA advice: 0.2)"},
     {"normalize", "false", "scale each head's scores by the mass its own top share keeps"}},
    [](const Params& p) {
      const double alpha = p.number("alpha");
      if (alpha < 0 || alpha > 1) throw Error("policy adakv: parameter 'alpha' must be in [0, 1]");
      return std::make_unique<AdaKv>(make_base_scorer(p.text("base"), "adakv"), alpha, p.boolean("normalize"));
    }});

}  // namespace kvsim
