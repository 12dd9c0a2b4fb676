// Future-attention oracle — an upper bound only an offline replay can compute (methods.md §14.8).
// Rule: keep the tokens that the evaluation queries after the compression point attend to most,
// summed over those queries and the group's query heads. With alloc=uniform it maximises the
// retained attention mass of every (layer, KV head) among all keep-sets of the same size;
// alloc=layer shares the layer's budget across heads (the bound for head-adaptive policies).
#include "core/error.h"
#include "policies/registry.h"
#include "policies/selection.h"

namespace kvsim {
namespace {

class OracleFuture : public ScoringPolicy {
 public:
  explicit OracleFuture(bool per_layer) : per_layer_(per_layer) {}
  bool selection_is_uniform() const override { return !per_layer_; }
  bool reads_future() const override { return true; }
  std::vector<HeadScores> score(const LayerSignals& s) const override {
    const ModelGeometry& g = s.geometry();
    std::vector<HeadScores> out(static_cast<std::size_t>(g.n_kv_heads));
    for (int h = 0; h < g.n_kv_heads; ++h) {
      std::vector<std::vector<float>> per_q;
      for (int r = 0; r < g.group(); ++r) per_q.push_back(column_sums(s.future_attention(h * g.group() + r)));
      out[static_cast<std::size_t>(h)].score = aggregate_group(per_q, GqaAgg::Sum);
    }
    return out;
  }
  LayerPlan compress(const LayerSignals& s, const Budget& budget) const override {
    if (!per_layer_) return select_uniform(cached_score(s), budget, s.geometry().n_kv_heads);
    // Exact maximiser of the layer's total retained mass: global top over (head, token).
    const auto& scores = cached_score(s);
    std::vector<float> flat;
    for (const auto& h : scores) flat.insert(flat.end(), h.score.begin(), h.score.end());
    const auto mask = top_k_mask(flat, budget.tokens * static_cast<std::int64_t>(scores.size()));
    LayerPlan plan;
    std::size_t offset = 0;
    for (const auto& h : scores) {
      plan.heads.push_back(plan_from_mask(std::span(mask).subspan(offset, h.score.size())));
      offset += h.score.size();
    }
    return plan;
  }

 private:
  bool per_layer_;
};

}  // namespace

KVSIM_REGISTER_POLICY(PolicyInfo{
    "oracle_future",
    "upper bound: keep what the future evaluation queries attend to most (offline only)",
    "kvsim oracle (methods.md §14.8)",
    {{"alloc", "uniform", "uniform: same budget per KV head | layer: layer budget shared across heads"}},
    [](const Params& p) {
      return std::make_unique<OracleFuture>(p.choice("alloc", {"uniform", "layer"}) == "layer");
    }});

}  // namespace kvsim
