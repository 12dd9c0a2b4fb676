#include "learned/scored_policy.h"

#include "core/error.h"
#include "learned/token_scorer.h"
#include "policies/selection.h"

namespace kvsim::learned {

namespace {

class ScoredPolicy : public ScoringPolicy {
 public:
  ScoredPolicy(const std::string& path, const std::string& method, std::int64_t sinks, std::int64_t window)
      : scorer_(path, method), prompts_(learned::training_prompts(scorer_.model())), sinks_(sinks), window_(window) {}
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

std::vector<ParamSpec> scored_policy_params(const std::string& method) {
  return {{"model", "", "model file written by kvsim train " + method + " (required)"},
          {"sinks", "0", "first tokens always kept"},
          {"window", "0", "most recent cached tokens always kept"}};
}

std::unique_ptr<Policy> make_scored_policy(const std::string& method, const Params& p) {
  const std::string path = p.text("model");
  if (path.empty())
    throw Error("policy " + method + ": parameter 'model' is required (a file from kvsim train " + method + ")");
  if (p.integer("sinks") < 0 || p.integer("window") < 0)
    throw Error("policy " + method + ": parameters 'sinks' and 'window' must be >= 0");
  return std::make_unique<ScoredPolicy>(path, method, p.integer("sinks"), p.integer("window"));
}

}  // namespace kvsim::learned
