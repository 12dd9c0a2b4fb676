// RLKV — "Which Heads Matter for Reasoning? RL-Guided KV Cache Compression" (Kurt232/RLKV:
// one gate per (layer, KV head), full cache vs sink + recent, shipped as adapter_weights.tsv;
// the deployment is DuoAttention's). Rule: ranked over the whole model, the heads with the highest
// gates keep their whole cache as far as the byte budget allows, the others sinks + recent tokens.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "learned/head_allocation.h"
#include "learned/model_file.h"
#include "policies/registry.h"
#include "policies/selection.h"

namespace kvsim::learned {
namespace {

class Rlkv : public Policy {
 public:
  Rlkv(std::string path, std::int64_t sinks, std::int64_t recent)
      : path_(std::move(path)), model_(read_learned_model(path_)), sinks_(sinks), recent_(recent) {
    // Method and geometry are checked here once; each layer then checks only the run's geometry.
    check_learned_model(model_, path_, "rlkv", model_.geometry);
    if (model_.head_gates.empty())
      throw Error(path_ + ": dataset 'head_gates' is empty; an rlkv model needs one gate per (layer, KV head)");
    prompts_ = learned::training_prompts(model_);
  }
  // Every layer computes the same model-wide allocation: the gates of every layer's heads, each
  // head's cache taken at the size the budget was set for (tokens / fraction), and the model's token
  // budget; a layer keeps the share it is given, divided among its own heads by gate over their
  // actual caches. Sliding-window layers hold their window and are not ranked.
  LayerPlan compress(const LayerSignals& s, const Budget& budget) const override {
    const ModelGeometry& g = s.geometry();
    check_learned_geometry(model_, path_, g);
    const auto H = static_cast<std::size_t>(g.n_kv_heads);
    std::vector<std::int64_t> n(H);
    for (std::size_t h = 0; h < H; ++h) n[h] = cache_size(s, static_cast<int>(h));
    const std::int64_t planned = budget.fraction > 0 && budget.fraction < 1
                                     ? std::llround(static_cast<double>(budget.tokens) / budget.fraction)
                                     : *std::max_element(n.begin(), n.end());
    std::vector<double> gates;
    std::size_t own = 0;  // the first of this layer's heads in the ranking
    for (int l = 0; l < g.n_layers; ++l) {
      if (g.window(l) > 0) continue;
      if (l == s.layer()) own = gates.size();
      for (std::size_t h = 0; h < H; ++h) gates.push_back(model_.head_gates[static_cast<std::size_t>(l) * H + h]);
    }
    const HeadAllocation model_wide =
        allocate_heads(gates, std::vector<std::int64_t>(gates.size(), planned),
                       budget.tokens * static_cast<std::int64_t>(gates.size()), sinks_, recent_);
    std::int64_t share = 0;
    for (std::size_t h = 0; h < H; ++h) share += model_wide.keep[own + h];
    const std::vector<double> layer_gates(gates.begin() + static_cast<std::ptrdiff_t>(own),
                                          gates.begin() + static_cast<std::ptrdiff_t>(own + H));
    const HeadAllocation a = allocate_heads(layer_gates, n, share, sinks_, recent_);
    LayerPlan plan;
    for (std::size_t h = 0; h < H; ++h)
      plan.heads.push_back(plan_from_mask(streaming_mask(s.cached(static_cast<int>(h)), sinks_, a.keep[h])));
    return plan;
  }
  bool reapplies_per_layer() const override { return false; }
  double state_bytes_per_head() const override { return 4.0; }  // heads differ in length: a length table
  std::span<const std::uint64_t> training_prompts() const override { return prompts_; }

 private:
  std::string path_;
  LearnedModel model_;
  std::int64_t sinks_, recent_;
  std::vector<std::uint64_t> prompts_;
};

}  // namespace

KVSIM_REGISTER_POLICY(PolicyInfo{
    "rlkv",
    "per-head gates ranked over the whole model: the highest-gated heads keep their whole cache within the budget, "
    "the rest sinks + recent",
    "RLKV (Kurt232/RLKV adapter_weights.tsv; DuoAttention's deployment); model from kvsim train rlkv",
    {{"model", "", "model file written by kvsim train rlkv (trained, or imported from adapter_weights.tsv)"},
     {"sinks", "16", "first tokens a streaming head keeps (RLKV: 16)"},
     {"recent", "64", "recent tokens a streaming head keeps at least (RLKV: 64); more when the budget allows"}},
    [](const Params& p) -> std::unique_ptr<Policy> {
      const std::string path = p.text("model");
      if (path.empty()) throw Error("policy rlkv: parameter 'model' is required (a file from kvsim train rlkv)");
      if (p.integer("sinks") < 0 || p.integer("recent") < 0)
        throw Error("policy rlkv: parameters 'sinks' and 'recent' must be >= 0");
      return std::make_unique<Rlkv>(path, p.integer("sinks"), p.integer("recent"));
    }});

}  // namespace kvsim::learned
