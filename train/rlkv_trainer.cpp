#include "train/rlkv_trainer.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <memory>
#include <ostream>

#include "core/error.h"
#include "core/rng.h"
#include "core/sha256.h"
#include "core/split.h"
#include "learned/mlp.h"
#include "kvcache/budget.h"
#include "learned/head_allocation.h"
#include "policies/selection.h"
#include "sim/replay.h"
#include "train/live_tasks.h"
#include "train/progress.h"
#include "train/reward_weights.h"

namespace kvsim::train {

namespace {

learned::LearnedModel gate_model(const ModelGeometry& g, std::vector<double> gates) {
  learned::LearnedModel m;
  m.method = "rlkv";
  m.geometry = g;
  m.head_gates = std::move(gates);
  m.provenance.created = utc_now();
  return m;
}

// A sampled head mask as a policy: a head with mask 1 keeps its whole cache, with 0 its streaming
// window (sinks first, then the most recent tokens). It keeps what the mask says whatever the
// budget; the config's budget is set to the mask's own bytes (mask_budget).
class HeadMaskPolicy : public Policy {
 public:
  HeadMaskPolicy(std::vector<std::uint8_t> mask, StreamingWindow w) : mask_(std::move(mask)), w_(w) {}
  LayerPlan compress(const LayerSignals& s, const Budget&) const override {
    const int H = s.geometry().n_kv_heads;
    LayerPlan plan;
    for (int h = 0; h < H; ++h) {
      const auto cached = s.cached(h);
      const auto n = static_cast<std::int64_t>(cached.size());
      const bool whole = mask_[static_cast<std::size_t>(s.layer() * H + h)] != 0;
      plan.heads.push_back(
          plan_from_mask(learned::streaming_mask(cached, w_.sinks, whole ? n : std::min(n, w_.sinks + w_.recent))));
    }
    return plan;
  }

 private:
  std::vector<std::uint8_t> mask_;
  StreamingWindow w_;
};

// The budget (a share of the full cache's bytes) a mask's cache holds at compression point c: its
// rows over the full cache's, sliding-window layers held at their windows. 1 when it holds all.
double mask_budget(const std::vector<std::uint8_t>& mask, const ModelGeometry& g, std::int64_t c,
                   const StreamingWindow& w) {
  const WindowShare share = window_share(g, c);
  double kept = static_cast<double>(share.local_tokens) * g.n_kv_heads;
  for (int l = 0; l < g.n_layers; ++l) {
    if (g.window(l) > 0) continue;
    for (int h = 0; h < g.n_kv_heads; ++h)
      kept += static_cast<double>(
          mask[static_cast<std::size_t>(l * g.n_kv_heads + h)] ? c : std::min(c, w.sinks + w.recent));
  }
  const double full = static_cast<double>(share.held_tokens) * g.n_kv_heads;
  return kept >= full ? 1.0 : (kept + 0.5) / full;
}

// Where the masks' rewards come from: replays of the traces or the live engine.
struct MaskRewards {
  const TrainingSet& set;
  const TrainingInputs& in;
  const RlkvOptions& o;
  std::vector<std::unique_ptr<TraceReader>> readers;
  std::vector<double> weights;
  LiveTasks live;

  MaskRewards(const TrainingSet& s, const TrainingInputs& inputs, const RlkvOptions& opts,
              const std::vector<int>& requests)
      : set(s),
        in(inputs),
        o(opts),
        weights(reward_layer_weights("train rlkv", opts.estimator, s.geometry.n_layers, inputs.mode)) {
    for (const auto& path : in.traces) readers.push_back(std::make_unique<TraceReader>(path));
    if (o.reward == "live")
      live = open_live_tasks("train rlkv", set, requests, o.model, o.tasks,
                             reward_verify_options(in.mode, o.max_new, o.min_new));
  }

  // Per mask, its reward per layer (trace: -w_l * the layer's squared output error; live: -KL
  // spread evenly over the layers, so that the sum over layers is the reward).
  std::vector<std::vector<double>> run(int r, const std::vector<std::vector<std::uint8_t>>& masks) const {
    const learned::TrainedRequest& req = set.provenance.requests[static_cast<std::size_t>(r)];
    const TraceReader& reader = *readers[static_cast<std::size_t>(req.trace)];
    const RequestHeader h = reader.header(req.id);
    const std::int64_t c = in.mode == ReplayMode::QueryAware ? h.n_prompt : h.question_start;
    std::vector<ReplayConfig> configs;
    for (const auto& m : masks)
      configs.push_back({"rlkv-mask", "", std::make_shared<const HeadMaskPolicy>(m, in.samples.window),
                         mask_budget(m, set.geometry, c, in.samples.window)});
    const auto L = static_cast<std::size_t>(set.geometry.n_layers);
    std::vector<std::vector<double>> reward(masks.size(), std::vector<double>(L, 0.0));
    if (o.reward == "live") {
      const LiveRequestResult res = live.verifier->run(live.task(set, r), configs);
      for (std::size_t k = 0; k < masks.size(); ++k)
        std::fill(reward[k].begin(), reward[k].end(), -res.configs[k].mean_kl / static_cast<double>(L));
      return reward;
    }
    const RequestResult res = Replayer(reader, in.mode, configs).replay(req.id);
    for (std::size_t k = 0; k < masks.size(); ++k)
      for (std::size_t l = 0; l < L; ++l) reward[k][l] = -weights[l] * res.configs[k].layer_out_sq[l];
    return reward;
  }
};

void check_options(const RlkvOptions& o) {
  if (o.steps < 1 || o.samples < 2 || !(o.lr > 0) || !(o.sparsity >= 0))
    throw Error(
        "train rlkv: --steps >= 1, --samples >= 2 (the baseline is the other samples), --lr > 0, --sparsity >= 0");
  if (o.reward != "trace" && o.reward != "live")
    throw Error("train rlkv: --reward is '" + o.reward + "'; expected trace or live");
  if (o.reward == "live" && (o.model.empty() || o.tasks.empty()))
    throw Error(
        "train rlkv: --reward live needs --model (the GGUF the traces were captured from) and --tasks (the task "
        "file of their requests)");
}

// The training requests (held-out ones excluded), in order.
std::vector<int> fit_requests(const TrainingSet& set) {
  std::vector<const HeadSample*> fit, held;
  split_held_out(set, fit, held);
  std::vector<int> out = requests_of(fit);
  if (out.empty()) throw Error("train rlkv: no requests to train on");
  return out;
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// The REINFORCE gradient of one step (to minimise: minus the expected reward, plus lambda * sum of
// the gates): each head's score function (m - g) weighted by its layer's advantage over the other
// masks' mean. Returns the masks' mean reward.
double mask_gradient(const std::vector<std::vector<std::uint8_t>>& masks,
                     const std::vector<std::vector<double>>& reward, const std::vector<double>& theta, int n_kv_heads,
                     double lambda, std::vector<double>& grad) {
  const std::size_t K = masks.size(), N = theta.size(), L = reward.front().size();
  std::vector<double> total(L, 0.0);
  double mean = 0;
  for (const auto& r : reward)
    for (std::size_t l = 0; l < L; ++l) {
      total[l] += r[l];
      mean += r[l] / static_cast<double>(K);
    }
  for (std::size_t i = 0; i < N; ++i) {
    const double g = sigmoid(theta[i]);
    const std::size_t l = i / static_cast<std::size_t>(n_kv_heads);
    double score = 0;
    for (std::size_t k = 0; k < K; ++k) {
      const double adv = reward[k][l] - (total[l] - reward[k][l]) / static_cast<double>(K - 1);
      score += adv * (masks[k][i] - g) / static_cast<double>(K);
    }
    grad[i] = -score + lambda * g * (1.0 - g);
  }
  return mean;
}

}  // namespace

learned::LearnedModel train_rlkv(const TrainingSet& set, const TrainingInputs& in, const RlkvOptions& o,
                                 std::ostream& progress) {
  check_options(o);
  const ModelGeometry& g = set.geometry;
  const std::vector<int> requests = fit_requests(set);
  const MaskRewards rewards(set, in, o, requests);
  const std::size_t N = static_cast<std::size_t>(g.n_layers * g.n_kv_heads);
  // The scale of the sparsity term: the all-streaming KL per head, over the training requests.
  double streaming_kl = 0;
  for (int r : requests) {
    const std::vector<std::vector<double>> streaming = rewards.run(r, {std::vector<std::uint8_t>(N, 0)});
    for (double x : streaming.front()) streaming_kl -= x / static_cast<double>(requests.size());
  }
  if (!(streaming_kl > 0))
    throw Error("train rlkv: every head's streaming window loses nothing on these requests; nothing to learn");
  const double lambda = o.sparsity * streaming_kl / static_cast<double>(N);
  std::vector<double> theta(N, 0.0), grad(N);
  learned::Adam adam(N, o.lr);
  Rng rng(o.seed, 0x726c6b76);
  learned::TrainingCurve curve{o.reward == "trace" ? "reward_trace" : "reward_live", {}, {}};
  Progress bar(progress, "train rlkv", o.steps, o.tty);
  std::vector<int> order = requests;
  for (std::int64_t step = 1; step <= o.steps; ++step) {
    const auto pos = static_cast<std::size_t>((step - 1) % static_cast<std::int64_t>(order.size()));
    if (pos == 0)  // a new pass over the requests, in a new order
      for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);
    std::vector<std::vector<std::uint8_t>> masks(static_cast<std::size_t>(o.samples), std::vector<std::uint8_t>(N));
    for (auto& m : masks)
      for (std::size_t i = 0; i < N; ++i) m[i] = rng.uniform() < sigmoid(theta[i]) ? 1 : 0;
    const double mean = mask_gradient(masks, rewards.run(order[pos], masks), theta, g.n_kv_heads, lambda, grad);
    adam.step(theta, grad);
    curve.step.push_back(static_cast<double>(step));
    curve.value.push_back(mean);
    bar.update(step, "reward", mean);
  }
  std::vector<double> gates(N);
  int open = 0;
  for (std::size_t i = 0; i < N; ++i) open += (gates[i] = sigmoid(theta[i])) > 0.5;
  progress << "train rlkv: " << open << " of " << N << " heads gated to the whole cache (gate > 0.5)\n";
  learned::LearnedModel m = gate_model(g, std::move(gates));
  m.curve = std::move(curve);
  m.provenance.traces = set.provenance.traces;
  m.provenance.requests = set.provenance.requests;
  m.provenance.seed = o.seed;
  m.provenance.hyperparameters = nlohmann::json{
      {"steps", o.steps},
      {"lr", o.lr},
      {"sparsity", o.sparsity},
      {"samples", o.samples},
      {"reward", o.reward},
      {"estimator", o.estimator},
      {"max_new", o.max_new},
      {"sinks", in.samples.window.sinks},
      {"recent", in.samples.window.recent},
      {"mode", mode_name(in.mode)}}.dump();
  m.results = nlohmann::json{{"heads_open", open},
                             {"heads", N},
                             {"all_streaming_kl", streaming_kl},
                             {"lambda", lambda},
                             {"train_seconds", bar.elapsed()}}
                  .dump();
  return m;
}

std::vector<double> mask_estimates(const TrainingSet& set, const TrainingInputs& in, const std::string& estimator,
                                   const std::vector<std::vector<std::uint8_t>>& masks) {
  RlkvOptions o;
  o.estimator = estimator;
  const std::vector<int> requests = fit_requests(set);
  const MaskRewards rewards(set, in, o, requests);
  std::vector<double> kl(masks.size(), 0.0);
  for (int r : requests) {
    const std::vector<std::vector<double>> reward = rewards.run(r, masks);
    for (std::size_t k = 0; k < masks.size(); ++k)
      for (double x : reward[k]) kl[k] -= x / static_cast<double>(requests.size());
  }
  return kl;
}

learned::LearnedModel import_rlkv_tsv(const std::string& path, const ModelGeometry& g, const std::string& trace) {
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot open the gate file");
  std::vector<double> gates;
  std::string line;
  int row = 0, line_no = 0;  // layers read; physical line (blank lines are skipped, not layers)
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    ++row;
    const std::vector<std::string> cells = split(line, '\t');
    if (static_cast<int>(cells.size()) != g.n_kv_heads)
      throw Error(path + ": line " + std::to_string(line_no) + " has " + std::to_string(cells.size()) +
                  " gates; expected " + std::to_string(g.n_kv_heads) + " (one per KV head of " + g.name + ")");
    for (std::size_t c = 0; c < cells.size(); ++c) {
      char* end = nullptr;
      const double v = std::strtod(cells[c].c_str(), &end);
      if (cells[c].empty() || *end != '\0' || !std::isfinite(v))
        throw Error(path + ": line " + std::to_string(line_no) + ", column " + std::to_string(c + 1) + ": '" +
                    cells[c] + "' is not a number");
      gates.push_back(v);
    }
  }
  if (row != g.n_layers)
    throw Error(path + ": " + std::to_string(row) + " lines of gates; expected " + std::to_string(g.n_layers) +
                " (one per layer of " + g.name + ")");
  learned::LearnedModel m = gate_model(g, std::move(gates));
  m.curve.metric = "none";
  m.provenance.traces = {{path, sha256_file_hex(path)}};
  m.provenance.hyperparameters = nlohmann::json{{"imported_from", path}, {"geometry_from", trace}}.dump();
  m.results = "{}";
  return m;
}

}  // namespace kvsim::train
