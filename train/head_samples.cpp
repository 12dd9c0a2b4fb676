#include "train/head_samples.h"

#include <mutex>

#include "core/error.h"
#include "learned/features.h"
#include "policies/registry.h"
#include "policies/selection.h"
#include "sim/replay.h"

namespace kvsim::train {

namespace {

// A policy that plans like the labeller (so the replay runs a real config) and records what it
// saw on the way.
class Recorder : public Policy {
 public:
  Recorder(std::shared_ptr<const ScoringPolicy> labeler, int request) : labeler_(std::move(labeler)), request_(request) {}
  bool reads_future() const override { return labeler_->reads_future(); }
  LayerPlan compress(const LayerSignals& s, const Budget& budget) const override {
    const std::vector<HeadScores> labels = labeler_->score(s);
    if (static_cast<int>(labels.size()) != s.geometry().n_kv_heads)
      throw Error("train: the labelling policy must score one entry per KV head (gqa aggregated)");
    std::vector<HeadSample> here;
    for (int kv = 0; kv < s.geometry().n_kv_heads; ++kv) {
      learned::HeadFeatures f = learned::extract_features(s, kv);
      here.push_back({request_, s.layer(), kv, f.tokens, std::move(f.x), labels[static_cast<std::size_t>(kv)].score});
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& h : here) samples_.push_back(std::move(h));
    }
    return select_uniform(labels, budget, s.geometry().n_kv_heads);
  }
  std::vector<HeadSample> take() const {
    std::lock_guard<std::mutex> lock(mu_);
    return std::move(samples_);
  }

 private:
  std::shared_ptr<const ScoringPolicy> labeler_;
  int request_;
  mutable std::mutex mu_;
  mutable std::vector<HeadSample> samples_;
};

}  // namespace

std::vector<HeadSample> collect_head_samples(const TraceReader& reader, const std::string& request_id, ReplayMode mode,
                                             const std::string& labeler, int request) {
  PolicyInstance inst = PolicyRegistry::instance().create(labeler);
  std::shared_ptr<const ScoringPolicy> scorer(dynamic_cast<const ScoringPolicy*>(inst.policy.get()));
  if (!scorer) throw Error("train: labelling policy '" + labeler + "' does not score tokens");
  inst.policy.release();
  auto recorder = std::make_shared<const Recorder>(scorer, request);
  // Any budget below 1 makes the replay compress; the samples do not depend on it.
  const Replayer replayer(reader, mode, {ReplayConfig{"train-recorder", inst.params, recorder, 0.5}});
  replayer.replay(request_id);
  std::vector<HeadSample> out = recorder->take();
  std::sort(out.begin(), out.end(), [](const HeadSample& a, const HeadSample& b) {
    return a.layer != b.layer ? a.layer < b.layer : a.kv_head < b.kv_head;
  });
  return out;
}

}  // namespace kvsim::train
