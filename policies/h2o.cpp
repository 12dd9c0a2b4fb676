// H2O — Zhang et al., "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of Large
// Language Models", NeurIPS 2023 (FMInference/H2O; prefill forms: KVCache-Factory H2OKVCluster,
// kvpress observed_attention_press.py).
// Rule: keep the recent tokens plus the "heavy hitters" with the largest accumulated attention.
// phase=decode (the paper's real-drop cache): scores start from the prompt queries' attention and
// keep accumulating the renormalised attention of every decode step, evicting the lowest-scored
// token outside the recent window whenever the cache exceeds its budget. phase=prefill: one cut.
#include <algorithm>

#include "core/error.h"
#include "policies/registry.h"
#include "policies/selection.h"

namespace kvsim {
namespace {

class H2oDecode : public DecodeState {
 public:
  // scores[kv][m] belongs to the m-th token of that head's cache, which the engine keeps in
  // token order: appends the new token, erases what we evict.
  H2oDecode(std::vector<std::vector<double>> scores, std::int64_t recent, GqaAgg gqa, int group)
      : scores_(std::move(scores)), recent_(recent), gqa_(gqa), group_(group) {}

  void step(const DecodeStep& s, std::vector<std::vector<std::int32_t>>& evict) override {
    for (std::size_t kv = 0; kv < s.cache.size(); ++kv) {
      const auto& cache = s.cache[kv];
      auto& sc = scores_[kv];
      sc.push_back(0.0);  // the new token starts from its own column
      if (sc.size() != cache.size()) throw Error("h2o: decode state out of step with the cache");
      // Accumulate this step's renormalised attention.
      for (std::size_t m = 0; m < cache.size(); ++m) {
        double add = 0.0;  // weights are >= 0, so 0 also starts a max
        for (int r = 0; r < group_; ++r) {
          const double w = s.attention[kv * static_cast<std::size_t>(group_) + static_cast<std::size_t>(r)][m];
          add = gqa_ == GqaAgg::Max ? std::max(add, w) : add + w;
        }
        sc[m] += gqa_ == GqaAgg::Mean ? add / group_ : add;
      }
      // Lowest scores outside the recent window (the newest recent_ tokens); ties drop the older token.
      const auto size = static_cast<std::int64_t>(cache.size());
      const std::vector<std::uint8_t> gone = lowest_rows(sc, size - recent_, size - s.budget);
      std::size_t out = 0;
      for (std::size_t m = 0; m < sc.size(); ++m) {
        if (gone[m])
          evict[kv].push_back(cache[m]);
        else
          sc[out++] = sc[m];
      }
      sc.resize(out);
    }
  }

  std::optional<DecodeRuleStart> rule() const override {
    if (gqa_ == GqaAgg::PerQueryHead) return std::nullopt;
    const HeadCombine c = gqa_ == GqaAgg::Max    ? HeadCombine::Max
                          : gqa_ == GqaAgg::Mean ? HeadCombine::Mean
                                                 : HeadCombine::Sum;
    return DecodeRuleStart{DecodeRule{true, false, c, recent_}, scores_};
  }

 private:
  std::vector<std::vector<double>> scores_;  // per KV head, aligned with its cache
  std::int64_t recent_;
  GqaAgg gqa_;
  int group_;
};

class H2o : public ScoringPolicy {
 public:
  H2o(double recent_ratio, bool normalize, GqaAgg gqa, bool decode, bool all_queries)
      : recent_ratio_(recent_ratio), normalize_(normalize), gqa_(gqa), decode_(decode), all_queries_(all_queries) {}

  std::vector<HeadScores> score(const LayerSignals& s) const override {
    const ModelGeometry& g = s.geometry();
    if (all_queries_) require_all_prompt_queries(s, 0, "h2o");
    const auto rows = s.observed_rows();  // increasing token indices
    std::vector<HeadScores> per_q(static_cast<std::size_t>(g.n_q_heads));
    for (int q = 0; q < g.n_q_heads; ++q) {
      const auto cached = s.cached(q / g.group());
      // Row blocks in order: the same sums as over the whole matrix, never n x n at once.
      std::vector<float> col(cached.size(), 0.0f);
      s.visit_observed_attention(q, [&](std::int64_t, const MatrixView& block) {
        if (block.cols != static_cast<std::int64_t>(col.size()))
          throw Error("h2o: observed attention over " + std::to_string(block.cols) + " tokens, the head caches " +
                      std::to_string(col.size()));
        for (std::int64_t i = 0; i < block.rows; ++i)
          for (std::int64_t j = 0; j < block.cols; ++j) col[static_cast<std::size_t>(j)] += block.at(i, j);
      });
      if (normalize_) {
        // kvpress normalisation: divide by how many observed queries could see each token, so
        // early tokens are not favoured just for being visible longer.
        for (std::size_t m = 0; m < col.size(); ++m) {
          const auto seen = rows.end() - std::lower_bound(rows.begin(), rows.end(), cached[m]);
          col[m] = seen > 0 ? col[m] / static_cast<float>(seen) : 0.0f;
        }
      }
      per_q[static_cast<std::size_t>(q)].score = std::move(col);
    }
    return group_scores(std::move(per_q), g.group(), gqa_);
  }

  LayerPlan compress(const LayerSignals& s, const Budget& budget) const override {
    auto scores = cached_score(s);  // a copy: the protected window depends on the budget
    Budget entry = budget;          // per plan entry: per KV head, or per query head
    entry.tokens = budget.tokens * s.geometry().n_kv_heads / static_cast<std::int64_t>(scores.size());
    for (auto& h : scores) h.protect = protect_ends(static_cast<std::int64_t>(h.score.size()), 0, recent(entry));
    return select_uniform(scores, budget, s.geometry().n_kv_heads);
  }
  std::unique_ptr<DecodeState> start_decode(const LayerSignals& s, const LayerPlan& initial,
                                            const Budget& budget) const override {
    if (!decode_) return nullptr;
    const auto& scores = cached_score(s);
    std::vector<std::vector<double>> kept(scores.size());
    for (std::size_t kv = 0; kv < scores.size(); ++kv)
      for (std::size_t j = 0; j < scores[kv].score.size(); ++j)
        if (initial.heads[kv].codec[j] != TokenCodec::Drop) kept[kv].push_back(scores[kv].score[j]);
    return std::make_unique<H2oDecode>(std::move(kept), recent(budget), gqa_, s.geometry().group());
  }
  bool selection_is_uniform() const override { return false; }
  std::int64_t decode_growth() const override { return decode_ ? 1 : 0; }
  // The accumulated score lives beside each cached token: one fp32.
  double state_bytes_per_token() const override { return 4.0; }

 private:
  std::int64_t recent(const Budget& b) const {
    return static_cast<std::int64_t>(recent_ratio_ * static_cast<double>(b.tokens));
  }
  double recent_ratio_;
  bool normalize_;
  GqaAgg gqa_;
  bool decode_;
  bool all_queries_;
};

}  // namespace

KVSIM_REGISTER_POLICY(PolicyInfo{
    "h2o",
    "recent window + heavy hitters by accumulated attention (prompt queries, then every decode step)",
    "Zhang et al., NeurIPS 2023, arXiv 2306.14048",
    {{"recent_ratio", "0.5", "share of the budget given to the most recent tokens (paper: heavy = recent)"},
     {"normalize", "false", "divide by the number of queries that saw each token (kvpress ObservedAttention)"},
     {"gqa", "sum", "GQA aggregation: mean | max | sum (RLKV's H2O baseline: sum) | per_query_head (prefill only)"},
     {"phase", "decode", "decode: keep accumulating and evicting every step (paper) | prefill: one cut"},
     {"queries", "all", "all: the prompt scores need every prompt query | recorded: use the ones the trace has"}},
    [](const Params& p) {
      const double r = p.number("recent_ratio");
      if (r < 0 || r > 1) throw Error("policy h2o: parameter 'recent_ratio' must be in [0, 1]");
      const GqaAgg gqa = parse_gqa(p.text("gqa"), "h2o");
      const bool decode = p.choice("phase", {"decode", "prefill"}) == "decode";
      if (decode && gqa == GqaAgg::PerQueryHead)
        throw Error("policy h2o: gqa=per_query_head is supported with phase=prefill only");
      const bool normalize = p.boolean("normalize");
      if (decode && normalize)  // per-step increments are not normalised: the scales would mix
        throw Error("policy h2o: normalize=true is supported with phase=prefill only");
      return std::make_unique<H2o>(r, normalize, gqa, decode, p.choice("queries", {"all", "recorded"}) == "all");
    }});

}  // namespace kvsim
