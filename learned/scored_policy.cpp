#include "learned/scored_policy.h"

#include <cmath>

#include "core/error.h"
#include "learned/token_scorer.h"
#include "policies/selection.h"

namespace kvsim::learned {

namespace {

class ScoredPolicy : public ScoringPolicy {
 public:
  ScoredPolicy(const std::string& path, const std::string& method, std::int64_t sinks, std::int64_t window, bool soft)
      : scorer_(path, method),
        prompts_(learned::training_prompts(scorer_.model())),
        sinks_(sinks),
        window_(window),
        soft_(soft) {}
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
  bool selection_is_uniform() const override { return !soft_; }
  // Soft (sigmoid_gate's training-time form): every token stays, its attention logit biased by
  // log g = -log(1 + exp(-score)), so attention is scaled by the gate and renormalised.
  LayerPlan compress(const LayerSignals& s, const Budget& budget) const override {
    if (!soft_) return ScoringPolicy::compress(s, budget);
    LayerPlan plan;
    for (const HeadScores& h : cached_score(s)) {
      HeadPlan hp;
      hp.codec.assign(h.score.size(), TokenCodec::Fp16);
      hp.logit_bias.reserve(h.score.size());
      for (std::size_t j = 0; j < h.score.size(); ++j) {
        const double z = h.score[j];
        const bool kept = !h.protect.empty() && h.protect[j];  // sinks and window: fully open
        hp.logit_bias.push_back(
            kept ? 0.0f : static_cast<float>(z >= 0 ? -std::log1p(std::exp(-z)) : z - std::log1p(std::exp(z))));
      }
      plan.heads.push_back(std::move(hp));
    }
    return plan;
  }

 private:
  TokenScorer scorer_;
  std::vector<std::uint64_t> prompts_;
  std::int64_t sinks_, window_;
  bool soft_;
};

}  // namespace

std::vector<ParamSpec> scored_policy_params(const std::string& method) {
  std::vector<ParamSpec> out = {{"model", "", "model file written by kvsim train " + method + " (required)"},
                                {"sinks", "0", "first tokens always kept"},
                                {"window", "0", "most recent cached tokens always kept"}};
  if (method == "sigmoid_gate")
    out.push_back({"soft", "0",
                   "1: the gates as trained, log g added to every token's attention logit and no token "
                   "dropped (the whole cache is held; live verify on the CPU engine only)"});
  return out;
}

std::unique_ptr<Policy> make_scored_policy(const std::string& method, const Params& p) {
  const std::string path = p.text("model");
  if (path.empty())
    throw Error("policy " + method + ": parameter 'model' is required (a file from kvsim train " + method + ")");
  if (p.integer("sinks") < 0 || p.integer("window") < 0)
    throw Error("policy " + method + ": parameters 'sinks' and 'window' must be >= 0");
  const std::int64_t soft = method == "sigmoid_gate" ? p.integer("soft") : 0;
  if (soft != 0 && soft != 1) throw Error("policy " + method + ": parameter 'soft' must be 0 or 1");
  return std::make_unique<ScoredPolicy>(path, method, p.integer("sinks"), p.integer("window"), soft == 1);
}

}  // namespace kvsim::learned
