// H2O — Zhang et al., "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of Large
// Language Models", NeurIPS 2023 (FMInference/H2O; prefill forms: KVCache-Factory H2OKVCluster,
// kvpress observed_attention_press.py).
// Rule: keep the recent tokens plus the "heavy hitters" with the largest accumulated attention.
// This is the prefill one-shot form: accumulated over the prompt queries recorded in the trace.
#include "core/error.h"
#include "policies/registry.h"
#include "policies/selection.h"

namespace kvsim {
namespace {

class H2oPrefill : public ScoringPolicy {
 public:
  H2oPrefill(double recent_ratio, bool normalize, GqaAgg gqa)
      : recent_ratio_(recent_ratio), normalize_(normalize), gqa_(gqa) {}

  std::vector<HeadScores> score(const LayerSignals& s) const override {
    const KvGeometry& g = s.geometry();
    const std::int64_t n = s.n_tokens();
    const auto rows = s.observed_rows();
    // kvpress normalisation: divide by how many observed queries could see each token, so
    // early tokens are not favoured just for being visible longer.
    std::vector<float> seen(static_cast<std::size_t>(n), 0.0f);
    for (auto r : rows)
      for (std::int64_t j = 0; j <= std::min<std::int64_t>(r, n - 1); ++j) seen[static_cast<std::size_t>(j)] += 1;
    std::vector<HeadScores> out(static_cast<std::size_t>(g.n_kv_heads));
    for (int h = 0; h < g.n_kv_heads; ++h) {
      std::vector<std::vector<float>> per_q;
      for (int r = 0; r < g.group(); ++r) {
        auto col = column_sums(s.observed_attention(h * g.group() + r));
        if (normalize_)
          for (std::size_t j = 0; j < col.size(); ++j) col[j] = seen[j] > 0 ? col[j] / seen[j] : 0.0f;
        per_q.push_back(std::move(col));
      }
      out[static_cast<std::size_t>(h)].score = aggregate_group(per_q, gqa_);
    }
    return out;
  }

  LayerPlan compress(const LayerSignals& s, const Budget& budget) const override {
    auto scores = score(s);
    const auto recent = static_cast<std::int64_t>(recent_ratio_ * static_cast<double>(budget.tokens));
    for (auto& h : scores) h.protect = protect_ends(s.n_tokens(), 0, recent);
    return select_uniform(scores, budget);
  }
  // The accumulated score lives beside each cached token: one fp32.
  double state_bytes_per_token() const override { return 4.0; }

 private:
  double recent_ratio_;
  bool normalize_;
  GqaAgg gqa_;
};

}  // namespace

KVSIM_REGISTER_POLICY(PolicyInfo{
    "h2o", "recent window + heavy hitters by accumulated attention of the recorded prompt queries (prefill one-shot)",
    "Zhang et al., NeurIPS 2023, arXiv 2306.14048",
    {{"recent_ratio", "0.5", "share of the budget given to the most recent tokens (paper: heavy = recent)"},
     {"normalize", "false", "divide by the number of queries that saw each token (kvpress ObservedAttention)"},
     {"gqa", "sum", "GQA aggregation: mean | max | sum (RLKV's H2O baseline: sum)"}},
    [](const Params& p) {
      const double r = p.number("recent_ratio");
      if (r < 0 || r > 1) throw Error("policy h2o: parameter 'recent_ratio' must be in [0, 1]");
      return std::make_unique<H2oPrefill>(r, p.boolean("normalize"), parse_gqa(p.text("gqa"), "h2o"));
    }});

}  // namespace kvsim
