// SnapKV — Li et al., "SnapKV: LLM Knows What You are Looking for Before Generation",
// NeurIPS 2024 (FasterDecoding/SnapKV snapkv_utils.py; kvpress snapkv_press.py for GQA).
// Rule: keep the window plus the prefix tokens the window's queries attend to most (pooled).
#include "policies/snapkv.h"

#include "core/error.h"
#include "policies/registry.h"

namespace kvsim {

std::vector<HeadScores> snapkv_scores(const LayerSignals& s, const SnapKvOptions& o) {
  const ModelGeometry& g = s.geometry();
  std::vector<HeadScores> per_q(static_cast<std::size_t>(g.n_q_heads));
  for (int q = 0; q < g.n_q_heads; ++q) {
    const std::int64_t n = cache_size(s, q / g.group());
    const int w = static_cast<int>(std::min<std::int64_t>(o.window, n));
    // Pool the prefix scores only (j < n - w, as SnapKV and kvpress do): the window's attention
    // to itself must not leak into its neighbours' scores. The window is kept regardless.
    auto summed = column_sums(s.window_attention(q, w));
    summed.resize(static_cast<std::size_t>(n - w));
    auto pooled = pool1d(summed, o.kernel, o.pool);
    pooled.resize(static_cast<std::size_t>(n), 0.0f);
    per_q[static_cast<std::size_t>(q)].score = std::move(pooled);
    per_q[static_cast<std::size_t>(q)].protect = protect_ends(n, 0, w);
  }
  return group_scores(std::move(per_q), g.group(), o.gqa);
}

std::vector<ParamSpec> snapkv_param_specs() {
  return {{"window", "32", "observation window: last prompt tokens whose queries vote (repo: 32; kvpress: 64)"},
          {"kernel", "5", "pooling kernel (repo: 5; paper LongBench: 7)"},
          {"pool", "avg", "avg | max | none (repo: avg; paper LongBench: max)"},
          {"gqa", "mean",
           "GQA: mean | max | sum over a group's query heads (kvpress: mean), or per_query_head (the original "
           "SnapKV: each query head keeps its own K/V copy, budget shared by the group)"}};
}

SnapKvOptions snapkv_options(const Params& p) {
  SnapKvOptions o;
  o.window = static_cast<int>(p.integer("window"));
  o.kernel = static_cast<int>(p.integer("kernel"));
  o.pool = parse_pool(p.text("pool"), p.policy());
  o.gqa = parse_gqa(p.text("gqa"), p.policy());
  if (o.window < 1) throw Error("policy " + p.policy() + ": parameter 'window' must be >= 1");
  if (o.kernel < 1) throw Error("policy " + p.policy() + ": parameter 'kernel' must be >= 1");
  return o;
}

namespace {

class SnapKv : public ScoringPolicy {
 public:
  explicit SnapKv(SnapKvOptions o) : o_(o) {}
  std::vector<HeadScores> score(const LayerSignals& s) const override { return snapkv_scores(s, o_); }

 private:
  SnapKvOptions o_;
};

}  // namespace

KVSIM_REGISTER_POLICY(PolicyInfo{"snapkv",
                                 "observation-window attention, pooled; keep window + top prefix (prefill one-shot)",
                                 "Li et al., NeurIPS 2024, arXiv 2404.14469", snapkv_param_specs(),
                                 [](const Params& p) { return std::make_unique<SnapKv>(snapkv_options(p)); }});

}  // namespace kvsim
