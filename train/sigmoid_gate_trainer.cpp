#include "train/sigmoid_gate_trainer.h"

#include <algorithm>
#include <map>
#include <set>
#include <cmath>
#include <nlohmann/json.hpp>
#include <numeric>
#include <ostream>

#include <filesystem>
#include <unistd.h>

#include "core/error.h"
#include "core/rng.h"
#include "learned/features.h"
#include "policies/registry.h"
#include "train/live_tasks.h"
#include "train/progress.h"

namespace kvsim::train {

namespace {

// 1 for the top `share` of tokens by score (at least one; ties: the later token), else 0.
std::vector<double> hard_gate(const std::vector<double>& score, double share) {
  const auto n = static_cast<std::int64_t>(score.size());
  std::vector<double> g(score.size(), 0.0);
  for (std::int64_t j :
       top_indices(score, std::max<std::int64_t>(1, static_cast<std::int64_t>(share * static_cast<double>(n)))))
    g[static_cast<std::size_t>(j)] = 1.0;
  return g;
}

double sigmoid(double s) { return 1.0 / (1.0 + std::exp(-s)); }

// The live soft-to-hard gap on `requests`: the engine runs the soft-gated cache (every token kept,
// log g added to its attention logits) and the hard one (each head's top tokens by g at the soft
// run's mean gate), and each is compared with the full cache over the continuation.
void live_gap(const learned::LearnedModel& m, const TrainingSet& set, const TrainingInputs& in,
              const std::vector<int>& requests, const SigmoidGateOptions& o, nlohmann::json& results,
              std::ostream& progress) {
  VerifyOptions vo;
  vo.mode = in.mode;
  vo.max_new = o.max_new;
  const LiveTasks live = open_live_tasks("train sigmoid_gate", set, requests, o.model, o.tasks, vo);
  // The policies read a model file: this one lives as long as the check.
  struct Scratch {
    std::string path =
        (std::filesystem::temp_directory_path() / ("kvsim-gate-" + std::to_string(::getpid()) + ".h5")).string();
    ~Scratch() {
      std::error_code ignored;  // a destructor must not throw
      std::filesystem::remove(path, ignored);
    }
  } scratch;
  learned::write_learned_model(m, scratch.path);
  const double capacity = results.at("soft_capacity").get<double>();
  std::vector<ReplayConfig> configs;
  for (const std::string& spec : {"sigmoid_gate:soft=1,model=" + scratch.path, "sigmoid_gate:model=" + scratch.path}) {
    PolicyInstance p = PolicyRegistry::instance().create(spec);
    configs.push_back({p.name, p.params, std::shared_ptr<const Policy>(std::move(p.policy)), capacity});
  }
  double kl[2] = {0, 0}, top1[2] = {0, 0};
  for (int r : requests) {
    const LiveRequestResult res = live.verifier->run(live.task(set, r), configs);
    for (int k = 0; k < 2; ++k) {
      kl[k] += res.configs[static_cast<std::size_t>(k)].mean_kl / static_cast<double>(requests.size());
      top1[k] += res.configs[static_cast<std::size_t>(k)].top1 / static_cast<double>(requests.size());
    }
  }
  results["live_requests"] = requests.size();
  results["live_kl_soft"] = kl[0];
  results["live_kl_hard_at_capacity"] = kl[1];
  results["live_top1_soft"] = top1[0];
  results["live_top1_hard_at_capacity"] = top1[1];
  results["live_soft_to_hard_gap"] = kl[1] - kl[0];
  progress << "train sigmoid_gate: live, " << requests.size() << " requests: next-token KL " << kl[0] << " soft-gated, "
           << kl[1] << " hard at mean gate " << capacity << " (soft-to-hard gap " << kl[1] - kl[0] << "); top-1 "
           << top1[0] << " / " << top1[1] << "\n";
}

}  // namespace

double gated_output_error(const HeadSample& h, std::span<const double> gate, std::vector<double>* grad) {
  const std::int64_t n = h.tokens;
  const auto d = static_cast<std::int64_t>(h.values.size()) / std::max<std::int64_t>(1, n);
  const std::int64_t rows = static_cast<std::int64_t>(h.attn.size()) / std::max<std::int64_t>(1, n);
  if (rows == 0 || d == 0) throw Error("train sigmoid_gate: samples carry no attention rows or values");
  std::vector<double> full(static_cast<std::size_t>(d)), soft(static_cast<std::size_t>(d)),
      dsoft(static_cast<std::size_t>(d));
  double total = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* a = h.attn.data() + r * n;
    std::fill(full.begin(), full.end(), 0.0);
    std::fill(soft.begin(), soft.end(), 0.0);
    double mass = 0, gmass = 0;
    for (std::int64_t j = 0; j < n; ++j) {
      if (a[j] == 0) continue;
      const float* v = h.values.data() + j * d;
      const double w = a[j], wg = w * gate[static_cast<std::size_t>(j)];
      mass += w;
      gmass += wg;
      for (std::int64_t c = 0; c < d; ++c)
        full[static_cast<std::size_t>(c)] += w * v[c], soft[static_cast<std::size_t>(c)] += wg * v[c];
    }
    if (mass <= 0) continue;
    if (gmass <= 0) {  // every token this row attends to is gated shut: o' = 0, a relative error of 1
      total += 1.0 / static_cast<double>(rows);
      continue;
    }
    double diff = 0, norm = 0;
    for (std::int64_t c = 0; c < d; ++c) {
      auto u = static_cast<std::size_t>(c);
      full[u] /= mass;
      soft[u] /= gmass;
      diff += (soft[u] - full[u]) * (soft[u] - full[u]);
      norm += full[u] * full[u];
    }
    const double scale = 1.0 / ((norm + 1e-12) * static_cast<double>(rows));
    total += diff * scale;
    if (!grad) continue;
    // d|o'-o|^2/do' = 2(o'-o); do'/dg_j = a_j (v_j - o') / sum(a g).
    for (std::int64_t c = 0; c < d; ++c)
      dsoft[static_cast<std::size_t>(c)] =
          2.0 * (soft[static_cast<std::size_t>(c)] - full[static_cast<std::size_t>(c)]) * scale;
    for (std::int64_t j = 0; j < n; ++j) {
      if (a[j] == 0) continue;
      const float* v = h.values.data() + j * d;
      double dot = 0;
      for (std::int64_t c = 0; c < d; ++c)
        dot += (v[c] - soft[static_cast<std::size_t>(c)]) * dsoft[static_cast<std::size_t>(c)];
      (*grad)[static_cast<std::size_t>(j)] += a[j] * dot / gmass;
    }
  }
  return total;
}

namespace {

// Scores (gate logits) of every token of a sample.
std::vector<double> logits(const learned::Mlp& net, const HeadSample& h, const std::vector<double>& mean,
                           const std::vector<double>& sd) {
  const std::vector<double> x = standardized(h.x, h.tokens, mean, sd);
  return net.forward(x.data(), h.tokens);
}

// Held-out figures: the soft-gated error and capacity, and hard deletions at three budgets by the
// learned gate, by the golden label and by the last 32 queries' attention (a SnapKV-like score).
nlohmann::json evaluate(const learned::Mlp& net, const std::vector<const HeadSample*>& heads,
                        const std::vector<double>& mean, const std::vector<double>& sd) {
  double soft = 0, capacity = 0;
  std::map<std::string, double> hard;
  const int window_column = learned::feature_index("attn_mean_32");
  for (const HeadSample* h : heads) {
    const std::vector<double> s = logits(net, *h, mean, sd);
    std::vector<double> g(s.size());
    std::transform(s.begin(), s.end(), g.begin(), sigmoid);
    soft += gated_output_error(*h, g);
    capacity += std::accumulate(g.begin(), g.end(), 0.0) / static_cast<double>(g.size());
    std::vector<double> golden(h->label.begin(), h->label.end()), window(static_cast<std::size_t>(h->tokens));
    for (std::int64_t i = 0; i < h->tokens; ++i)
      window[static_cast<std::size_t>(i)] = h->x[static_cast<std::size_t>(i * learned::kFeatureCount + window_column)];
    for (double share : {0.1, 0.25, 0.5}) {
      const std::string k = std::to_string(static_cast<int>(share * 100));
      hard["hard_error_" + k] += gated_output_error(*h, hard_gate(s, share));
      hard["golden_error_" + k] += gated_output_error(*h, hard_gate(golden, share));
      hard["window32_error_" + k] += gated_output_error(*h, hard_gate(window, share));
    }
    hard["hard_error_at_capacity"] +=
        gated_output_error(*h, hard_gate(s, std::accumulate(g.begin(), g.end(), 0.0) / static_cast<double>(g.size())));
  }
  const double n = static_cast<double>(std::max<std::size_t>(1, heads.size()));
  nlohmann::json r;
  r["soft_error"] = soft / n;
  r["soft_capacity"] = capacity / n;
  for (const auto& [k, v] : hard) r[k] = v / n;
  r["soft_to_hard_gap"] = r["hard_error_at_capacity"].get<double>() - r["soft_error"].get<double>();
  return r;
}

}  // namespace

learned::LearnedModel train_sigmoid_gate(const TrainingSet& set, const TrainingInputs& in, const SigmoidGateOptions& o,
                                         std::ostream& progress) {
  if (o.model.empty() != o.tasks.empty())
    throw Error(
        "train sigmoid_gate: the live gap needs both --model (the GGUF the traces were captured from) and --tasks "
        "(their task file)");
  if (o.steps < 1 || o.heads_per_step < 1 || !(o.lr > 0) || !(o.capacity > 0 && o.capacity <= 1) || !(o.penalty >= 0))
    throw Error("train sigmoid_gate: --steps, --heads-per-step >= 1, --lr > 0, --capacity in (0, 1], --penalty >= 0");
  std::vector<const HeadSample*> fit, held;
  split_held_out(set, fit, held);
  if (fit.empty()) throw Error("train sigmoid_gate: no samples to fit");
  std::vector<double> mean, sd;
  feature_moments(fit, mean, sd);
  const std::vector<int> sizes = scorer_sizes(o.hidden);
  learned::Mlp net(sizes, o.activation, o.seed);
  // Start with every gate open (bias of the output ~ +2): the soft run begins at the full cache.
  net.params()[net.bias_offset(static_cast<int>(sizes.size()) - 2)] = 2.0;
  learned::Adam adam(net.params().size(), o.lr);
  adam.clip_norm = 10.0;
  Rng rng(o.seed, 0x7369676d);
  learned::TrainingCurve curve{"gated_error_plus_capacity", {}, {}};
  Progress bar(progress, "train sigmoid_gate", o.steps, o.tty);
  std::vector<double> grad;
  for (std::int64_t step = 1; step <= o.steps; ++step) {
    grad.assign(net.params().size(), 0.0);
    double loss = 0;
    for (int k = 0; k < o.heads_per_step; ++k) {
      const HeadSample& h = *fit[rng.below(fit.size())];
      const std::vector<double> x = standardized(h.x, h.tokens, mean, sd);
      learned::Mlp::Tape tape;
      const std::vector<double> s = net.forward(x.data(), h.tokens, &tape);
      std::vector<double> g(s.size()), dg(s.size(), 0.0);
      std::transform(s.begin(), s.end(), g.begin(), sigmoid);
      const double err = gated_output_error(h, g, &dg);
      const double over =
          std::max(0.0, std::accumulate(g.begin(), g.end(), 0.0) / static_cast<double>(g.size()) - o.capacity);
      loss += (err + o.penalty * over * over) / o.heads_per_step;
      std::vector<double> ds(s.size());
      for (std::size_t j = 0; j < s.size(); ++j)
        ds[j] =
            (dg[j] + o.penalty * 2.0 * over / static_cast<double>(g.size())) * g[j] * (1.0 - g[j]) / o.heads_per_step;
      net.backward(tape, ds.data(), grad);
    }
    adam.step(net.params(), grad);
    curve.step.push_back(static_cast<double>(step));
    curve.value.push_back(loss);
    bar.update(step, "loss", loss);
  }
  nlohmann::json results = evaluate(net, held.empty() ? fit : held, mean, sd);
  results["evaluated_on"] = evaluated_on(!held.empty());
  results["train_seconds"] = bar.elapsed();
  progress << "train sigmoid_gate: soft-gated output error " << results["soft_error"].get<double>() << " at mean gate "
           << results["soft_capacity"].get<double>() << "; hard top by gate at that share "
           << results["hard_error_at_capacity"].get<double>() << " (soft-to-hard gap "
           << results["soft_to_hard_gap"].get<double>() << "), on " << results["evaluated_on"].get<std::string>()
           << "\n";

  learned::LearnedModel m = scorer_model("sigmoid_gate", set, std::move(net), mean, sd, std::move(curve), o.seed);
  m.provenance.hyperparameters =
      scorer_hyperparameters(o, nlohmann::json{{"capacity", o.capacity}, {"penalty", o.penalty}}.dump());
  if (!o.model.empty()) {
    std::set<int> ids;
    for (const HeadSample* h : held.empty() ? fit : held) ids.insert(h->request);
    const std::vector<int> requests(ids.begin(), ids.end());
    live_gap(m, set, in, requests, o, results, progress);
  }
  m.results = results.dump();
  return m;
}

}  // namespace kvsim::train
