#include "train/head_samples.h"

#include <mutex>

#include "core/error.h"
#include "kvcache/budget.h"
#include "learned/features.h"
#include "policies/registry.h"
#include "policies/selection.h"
#include "sim/replay.h"

namespace kvsim::train {

namespace {

// Evenly spaced evaluation rows of every query head of KV head kv's group, and its values.
void keep_outputs(const LayerSignals& s, int kv, std::int64_t max_rows, HeadSample& out) {
  const int G = s.geometry().group();
  const MatrixView first = s.future_attention(kv * G);
  const std::int64_t rows = std::min(max_rows, first.rows);
  out.rows = rows;
  for (int r = 0; r < G; ++r) {
    const MatrixView a = s.future_attention(kv * G + r);
    for (std::int64_t i = 0; i < rows; ++i) {
      const std::int64_t src = rows == 1 ? a.rows - 1 : i * (a.rows - 1) / (rows - 1);
      out.attn.insert(out.attn.end(), a.row(src), a.row(src) + a.cols);
    }
  }
  const MatrixView v = s.values(kv);
  out.values.assign(v.data, v.data + v.rows * v.cols);
}

// A policy that plans like the labeller (so the replay runs a real config) and records what it
// saw on the way.
class Recorder : public Policy {
 public:
  Recorder(std::shared_ptr<const ScoringPolicy> labeler, int request, SampleOptions o)
      : labeler_(std::move(labeler)), request_(request), o_(std::move(o)) {}
  bool reads_future() const override { return labeler_->reads_future(); }
  LayerPlan compress(const LayerSignals& s, const Budget& budget) const override {
    const std::vector<HeadScores> labels = labeler_->score(s);
    if (static_cast<int>(labels.size()) != s.geometry().n_kv_heads)
      throw Error("train: the labelling policy must score one entry per KV head (gqa aggregated)");
    std::vector<HeadSample> here;
    for (int kv = 0; kv < s.geometry().n_kv_heads; ++kv) {
      learned::HeadFeatures f = learned::extract_features(s, kv);
      here.push_back({request_,
                      s.layer(),
                      kv,
                      f.tokens,
                      std::move(f.x),
                      labels[static_cast<std::size_t>(kv)].score,
                      streaming_error(s, kv, o_.window),
                      0,
                      {},
                      {}});
      here.back().point = s.n_tokens();
      if (o_.output_rows > 0) keep_outputs(s, kv, o_.output_rows, here.back());
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
  SampleOptions o_;
  mutable std::mutex mu_;
  mutable std::vector<HeadSample> samples_;
};

}  // namespace

double streaming_error(const LayerSignals& s, int kv, const StreamingWindow& window) {
  const ModelGeometry& g = s.geometry();
  const auto cached = s.cached(kv);
  const auto n = static_cast<std::int64_t>(cached.size());
  std::vector<std::uint8_t> in(static_cast<std::size_t>(n), 0);
  for (std::int64_t j = 0; j < n; ++j)
    in[static_cast<std::size_t>(j)] = cached[static_cast<std::size_t>(j)] < window.sinks || j >= n - window.recent;
  const MatrixView v = s.values(kv);
  const auto d = static_cast<std::size_t>(v.cols);
  double sum = 0;
  std::int64_t rows = 0;
  std::vector<double> full(d), stream(d);
  for (int r = 0; r < g.group(); ++r) {
    const MatrixView a = s.future_attention(kv * g.group() + r);  // [E, n]
    for (std::int64_t i = 0; i < a.rows; ++i) {
      std::fill(full.begin(), full.end(), 0.0);
      std::fill(stream.begin(), stream.end(), 0.0);
      double mass = 0, stream_mass = 0;
      for (std::int64_t j = 0; j < n; ++j) {
        const double w = a.at(i, j);
        if (w == 0) continue;
        const float* vj = v.row(j);
        mass += w;
        for (std::size_t c = 0; c < d; ++c) full[c] += w * vj[c];
        if (!in[static_cast<std::size_t>(j)]) continue;
        stream_mass += w;
        for (std::size_t c = 0; c < d; ++c) stream[c] += w * vj[c];
      }
      if (mass <= 0) continue;
      double diff = 0, norm = 0;
      for (std::size_t c = 0; c < d; ++c) {
        const double f = full[c] / mass, st = stream_mass > 0 ? stream[c] / stream_mass : 0.0;
        diff += (st - f) * (st - f);
        norm += f * f;
      }
      sum += diff / (norm + 1e-12);
      ++rows;
    }
  }
  return rows ? sum / static_cast<double>(rows) : 0.0;
}

std::vector<HeadSample> collect_head_samples(const TraceReader& reader, const std::string& request_id, ReplayMode mode,
                                             int request, const SampleOptions& o) {
  const std::string& labeler = o.labeler;
  PolicyInstance inst = PolicyRegistry::instance().create(labeler);
  std::shared_ptr<const ScoringPolicy> scorer(dynamic_cast<const ScoringPolicy*>(inst.policy.get()));
  if (!scorer) throw Error("train: labelling policy '" + labeler + "' does not score tokens");
  inst.policy.release();
  auto recorder = std::make_shared<const Recorder>(scorer, request, o);
  if (o.decode_block > 0) {
    if (!(o.trajectory_budget > 0 && o.trajectory_budget < 1))
      throw Error("train: the labelling trajectory's budget " + std::to_string(o.trajectory_budget) +
                  " is not in (0, 1)");
    // The labeller's own trajectory, held to its budget and re-applied every block.
    const Replayer replayer(reader, mode, {ReplayConfig{"train-recorder", inst.params, recorder, o.trajectory_budget}},
                            0, BudgetRule{true, o.decode_block});
    replayer.replay(request_id);
  } else {
    // Any budget below 1 makes the replay compress; the samples do not depend on it.
    const Replayer replayer(reader, mode, {ReplayConfig{"train-recorder", inst.params, recorder, 0.5}});
    replayer.replay(request_id);
  }
  std::vector<HeadSample> out = recorder->take();
  std::sort(out.begin(), out.end(), [](const HeadSample& a, const HeadSample& b) {
    return a.layer != b.layer ? a.layer < b.layer : a.kv_head != b.kv_head ? a.kv_head < b.kv_head : a.point < b.point;
  });
  return out;
}

}  // namespace kvsim::train
