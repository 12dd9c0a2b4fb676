// ForesightKV — Li et al., "ForesightKV", arXiv 2602.03203 (RUCAIBox/ForesightKV: a small scorer
// trained with a pairwise hinge loss against the golden eviction label, oracle_golden here).
// Rule: keep each KV head's top tokens by a learned scorer over the token features
// (learned/features.h); trained by `kvsim train foresight`.
#include "core/error.h"
#include "learned/token_scorer.h"
#include "policies/registry.h"
#include "policies/selection.h"

namespace kvsim::learned {
namespace {

class Foresight : public ScoringPolicy {
 public:
  Foresight(const std::string& path, std::int64_t sinks, std::int64_t window)
      : scorer_(path, "foresight"), prompts_(learned::training_prompts(scorer_.model())), sinks_(sinks), window_(window) {}
  std::vector<HeadScores> score(const LayerSignals& s) const override {
    std::vector<HeadScores> out(static_cast<std::size_t>(s.geometry().n_kv_heads));
    for (int kv = 0; kv < s.geometry().n_kv_heads; ++kv) {
      HeadScores& h = out[static_cast<std::size_t>(kv)];
      h.score = scorer_.score(s, kv);
      if (sinks_ > 0 || window_ > 0) h.protect = protect_cached(s.cached(kv), sinks_, window_);
    }
    return out;
  }
  std::span<const std::uint64_t> training_prompts() const override { return prompts_; }

 private:
  TokenScorer scorer_;
  std::vector<std::uint64_t> prompts_;
  std::int64_t sinks_, window_;
};

}  // namespace

KVSIM_REGISTER_POLICY(PolicyInfo{
    "foresight",
    "learned per-token scorer (pairwise ranking against the golden eviction label); keep each head's top tokens",
    "Li et al., ForesightKV, arXiv 2602.03203 (model from kvsim train foresight)",
    {{"model", "", "model file written by kvsim train foresight (required)"},
     {"sinks", "0", "first tokens always kept"},
     {"window", "0", "most recent cached tokens always kept"}},
    [](const Params& p) -> std::unique_ptr<Policy> {
      const std::string path = p.text("model");
      if (path.empty()) throw Error("policy foresight: parameter 'model' is required (a file from kvsim train foresight)");
      if (p.integer("sinks") < 0 || p.integer("window") < 0)
        throw Error("policy foresight: parameters 'sinks' and 'window' must be >= 0");
      return std::make_unique<Foresight>(path, p.integer("sinks"), p.integer("window"));
    }});

}  // namespace kvsim::learned
