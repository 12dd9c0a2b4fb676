// TOVA — Oren et al., "Transformers are Multi-State RNNs", EMNLP 2024
// (schwartz-lab-NLP/TOVA tova_cache.py; kvpress tova_press.py for the prefill form).
// Rule: keep the tokens the current query attends to most, averaged over all query heads of the
// layer; one token set for every KV head. phase=decode (the paper) drops the lowest token at
// every step; phase=prefill (kvpress) cuts once using the last prompt query.
#include <algorithm>
#include <limits>

#include "core/error.h"
#include "policies/registry.h"
#include "policies/selection.h"

namespace kvsim {
namespace {

class TovaDecode : public DecodeState {
 public:
  void step(const DecodeStep& s, std::vector<std::vector<std::int32_t>>& evict) override {
    // Every KV head holds the same tokens (one set per layer), so the weights of all query
    // heads line up position by position.
    const auto& cache = s.cache[0];
    std::vector<double> mean(cache.size(), 0.0);
    for (const auto& w : s.attention)
      for (std::size_t m = 0; m < cache.size(); ++m) mean[m] += w[m];
    // Lowest mean weight, the newest token (the current query) excluded; ties drop the older.
    const auto size = static_cast<std::int64_t>(cache.size());
    const std::vector<std::uint8_t> gone = lowest_rows(mean, size - 1, size - s.budget);
    for (std::size_t m = 0; m < cache.size(); ++m)
      if (gone[m])
        for (auto& e : evict) e.push_back(cache[m]);
  }
  // The mean over heads orders tokens as their sum does: the rule sums, as step() does.
  std::optional<DecodeRuleStart> rule() const override {
    return DecodeRuleStart{DecodeRule{false, true, HeadCombine::Sum, 1}, {}};
  }
};

class Tova : public ScoringPolicy {
 public:
  explicit Tova(bool decode) : decode_(decode) {}
  std::vector<HeadScores> score(const LayerSignals& s) const override {
    const ModelGeometry& g = s.geometry();
    // One token set for the layer: every KV head must hold the same tokens.
    for (int kv = 1; kv < g.n_kv_heads; ++kv)
      if (!std::equal(s.cached(kv).begin(), s.cached(kv).end(), s.cached(0).begin(), s.cached(0).end()))
        throw Error("policy tova: KV heads hold different tokens; TOVA keeps one set per layer");
    std::vector<std::vector<float>> rows;
    for (int q = 0; q < g.n_q_heads; ++q) rows.push_back(column_sums(s.window_attention(q, 1)));
    HeadScores h;
    h.score = aggregate_group(rows, GqaAgg::Mean);
    h.protect = protect_ends(cache_size(s, 0), 0, 1);  // the current (last) token stays
    return std::vector<HeadScores>(static_cast<std::size_t>(g.n_kv_heads), h);
  }
  std::unique_ptr<DecodeState> start_decode(const LayerSignals&, const LayerPlan&, const Budget&) const override {
    return decode_ ? std::make_unique<TovaDecode>() : nullptr;
  }
  bool selection_is_uniform() const override { return !decode_; }
  std::int64_t decode_growth() const override { return decode_ ? 1 : 0; }

 private:
  bool decode_;
};

}  // namespace

KVSIM_REGISTER_POLICY(PolicyInfo{
    "tova",
    "attention of the current query, mean over all heads of the layer, same set for "
    "every KV head",
    "Oren et al., EMNLP 2024, arXiv 2401.06104",
    {{"phase", "decode", "decode: drop the lowest token every step (paper) | prefill: once (kvpress)"}},
    [](const Params& p) {
      return std::make_unique<Tova>(p.choice("phase", {"decode", "prefill"}) == "decode");
    }});

}  // namespace kvsim
