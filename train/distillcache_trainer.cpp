#include "train/distillcache_trainer.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <ostream>

#include "core/error.h"
#include "core/rng.h"
#include "learned/features.h"
#include "learned/token_scorer.h"
#include "policies/selection.h"
#include "sim/replay.h"
#include "train/live_tasks.h"
#include "train/plackett_luce.h"
#include "train/progress.h"
#include "train/reward_weights.h"
#include "train/step_credit.h"

namespace kvsim::train {

namespace {

// The network and its input standardisation, as the policy will run them.
struct Scorer {
  learned::Mlp net;
  std::vector<double> mean, sd;
};

// Every KV head's raw features and scores in one layer. An episode's samples share one Scorer,
// so they share this through the layer's memo: extracted and scored once, not once per sample.
struct LayerScores {
  std::vector<learned::HeadFeatures> features;  // [n_kv_heads]
  std::vector<std::vector<double>> scores;      // [n_kv_heads][tokens]
};

// One sampled choice in one (layer, KV head) at one point (`tokens` cached tokens: the compression
// point, or a decode step where the rule re-applies): the layer's shared features and the picks.
struct Action {
  int layer = 0, kv = 0;
  std::int64_t tokens = 0;
  std::shared_ptr<const LayerScores> inputs;
  std::vector<std::int64_t> chosen;
  const learned::HeadFeatures& features() const { return inputs->features[static_cast<std::size_t>(kv)]; }
};

// A policy drawing each head's kept tokens from Plackett-Luce over the network's scores (or, with
// greedy, its top tokens), recording its actions. Draws depend on (seed, layer, head, point) only,
// so they do not depend on which thread runs the layer.
class SampledPolicy : public Policy {
 public:
  SampledPolicy(std::shared_ptr<const Scorer> scorer, double tau, std::uint64_t seed, bool greedy)
      : scorer_(std::move(scorer)), tau_(tau), seed_(seed), greedy_(greedy) {}
  LayerPlan compress(const LayerSignals& s, const Budget& budget) const override {
    const auto inputs = std::static_pointer_cast<const LayerScores>(s.memo(scorer_.get(), [&] {
      auto out = std::make_shared<LayerScores>();
      for (int kv = 0; kv < s.geometry().n_kv_heads; ++kv) {
        out->features.push_back(learned::extract_features(s, kv));
        const learned::HeadFeatures& f = out->features.back();
        const std::vector<double> x = standardized(f.x, f.tokens, scorer_->mean, scorer_->sd);
        out->scores.push_back(scorer_->net.forward(x.data(), f.tokens));
      }
      return std::shared_ptr<const void>(std::move(out));
    }));
    LayerPlan plan;
    for (int kv = 0; kv < s.geometry().n_kv_heads; ++kv) {
      Action a{s.layer(), kv, s.n_tokens(), inputs, {}};
      const std::int64_t tokens = a.features().tokens;
      const std::vector<double>& score = inputs->scores[static_cast<std::size_t>(kv)];
      std::vector<std::uint8_t> keep(static_cast<std::size_t>(tokens), 0);
      if (budget.tokens >= tokens) {
        std::fill(keep.begin(), keep.end(), 1);
      } else {
        Rng rng(seed_, static_cast<std::uint64_t>(s.layer()), static_cast<std::uint64_t>(kv),
                static_cast<std::uint64_t>(s.n_tokens()));
        a.chosen =
            greedy_ ? sample_top_k(score, budget.tokens, 1e-9, rng) : sample_top_k(score, budget.tokens, tau_, rng);
        for (std::int64_t j : a.chosen) keep[static_cast<std::size_t>(j)] = 1;
      }
      plan.heads.push_back(plan_from_mask(keep));
      if (!greedy_ && !a.chosen.empty()) {
        std::lock_guard<std::mutex> lock(mu_);
        actions_.push_back(std::move(a));
      }
    }
    return plan;
  }
  std::vector<Action> take() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::sort(actions_.begin(), actions_.end(), [](const Action& a, const Action& b) {
      return a.layer != b.layer ? a.layer < b.layer : a.tokens != b.tokens ? a.tokens < b.tokens : a.kv < b.kv;
    });
    return std::move(actions_);
  }

 private:
  std::shared_ptr<const Scorer> scorer_;
  double tau_;
  std::uint64_t seed_;
  bool greedy_;
  mutable std::mutex mu_;
  mutable std::vector<Action> actions_;
};

void check_options(const DistillCacheOptions& o) {
  if (o.reward != "trace" && o.reward != "live")
    throw Error("train distillcache: --reward is '" + o.reward + "'; expected trace or live");
  if (!(o.discount >= 0 && o.discount <= 1))
    throw Error("train distillcache: --discount is " + std::to_string(o.discount) + "; expected 0 to 1");
  if (o.episodes < 1 || o.samples < 2 || !(o.lr > 0) || !(o.temperature > 0) || o.budgets.empty())
    throw Error(
        "train distillcache: --episodes >= 1, --samples >= 2 (the baseline is the other samples), --lr and "
        "--temperature > 0, at least one budget");
  for (double b : o.budgets)
    if (!(b > 0 && b < 1)) throw Error("train distillcache: budget " + std::to_string(b) + " is not in (0, 1)");
  if (o.reward == "live" && (o.model.empty() || o.tasks.empty()))
    throw Error(
        "train distillcache: --reward live needs --model (the GGUF the traces were captured from) and --tasks "
        "(the task file of their requests)");
}

// The scorer training starts from: an --init model's, or a seeded network over the fit samples'
// feature moments.
std::shared_ptr<Scorer> initial_scorer(const DistillCacheOptions& o, const std::vector<const HeadSample*>& fit,
                                       const ModelGeometry& g) {
  auto scorer = std::make_shared<Scorer>();
  if (!o.init.empty()) {
    learned::LearnedModel init = learned::read_learned_model(o.init);
    if (init.method != "foresight" && init.method != "distillcache")
      throw Error(o.init + ": attribute 'method' is '" + init.method +
                  "'; --init takes a foresight or distillcache model");
    learned::check_learned_model(init, o.init, init.method, g);
    scorer->net = std::move(init.network);
    scorer->mean = init.norm_mean;
    scorer->sd = init.norm_std;
  } else {
    feature_moments(fit, scorer->mean, scorer->sd);
    scorer->net = learned::Mlp(scorer_sizes(o.hidden), o.activation, o.seed);
  }
  return scorer;
}

// One episode's rewards, per step: per credit group and sample, the reward at each step, and the
// token whose query each step's distribution came from. The trace reward has a group per layer:
// replay is teacher-forced, so a layer's actions change only its own error. The live reward has
// one group, the model's next-token KL, which every layer's actions share.
struct EpisodeRewards {
  std::vector<std::int64_t> step_query;
  std::vector<std::vector<std::vector<double>>> reward;  // [group][sample][step]
};

// REINFORCE over one episode's samples: each sampled (layer, head) action's Plackett-Luce log
// probability, weighted by its advantage (step_credit.h): its group's return from the first step
// the action can change, less the other samples' return from that step. Added to `grad`. Counts
// the actions (and those after the compression point); returns the episode's mean reward per
// step (summed over the groups, averaged over the samples).
double episode_gradient(const Scorer& scorer, const std::vector<std::shared_ptr<const SampledPolicy>>& policies,
                        const EpisodeRewards& ep, double temperature, double discount, std::vector<double>& grad,
                        std::int64_t& actions, std::int64_t& decode_actions) {
  std::vector<StepCredit> credit;
  double mean_reward = 0;
  for (const auto& group : ep.reward) {
    credit.emplace_back(group, discount);
    for (const auto& sample : group)
      for (double r : sample)
        mean_reward += r / static_cast<double>(policies.size() * std::max<std::size_t>(1, sample.size()));
  }
  for (std::size_t k = 0; k < policies.size(); ++k) {
    const std::vector<Action> taken = policies[k]->take();
    std::map<int, std::int64_t> point;  // per layer, the compression point: its earliest action
    for (const Action& a : taken) point.emplace(a.layer, a.tokens);  // sorted by (layer, tokens)
    for (const Action& a : taken) {
      ++actions;
      if (a.tokens > point.at(a.layer)) ++decode_actions;
      const StepCredit& c = credit[credit.size() == 1 ? 0 : static_cast<std::size_t>(a.layer)];
      const double adv = c.advantage(k, first_affected_step(ep.step_query, a.tokens));
      if (adv == 0) continue;
      learned::Mlp::Tape tape;
      const learned::HeadFeatures& f = a.features();
      const std::vector<double> x = standardized(f.x, f.tokens, scorer.mean, scorer.sd);
      const std::vector<double> s = scorer.net.forward(x.data(), f.tokens, &tape);
      std::vector<double> dlp;
      pl_log_prob(s, a.chosen, temperature, &dlp);
      for (double& v : dlp) v *= -adv / static_cast<double>(policies.size());  // minimise -A log pi
      scorer.net.backward(tape, dlp.data(), grad);
    }
  }
  return mean_reward;
}

// The trace's weighted estimate for the greedy policy (top tokens by score) of the initial and of
// the final scorer, at budget b, averaged over the `eval` requests.
std::pair<double, double> greedy_estimates(const TrainingSet& set, const TrainingInputs& in,
                                           const DistillCacheOptions& o,
                                           const std::vector<std::unique_ptr<TraceReader>>& readers,
                                           const std::vector<double>& weights, const std::vector<int>& eval, double b,
                                           const std::shared_ptr<const Scorer>& initial,
                                           const std::shared_ptr<const Scorer>& final_scorer) {
  double before = 0, after = 0;
  for (int r : eval) {
    const learned::TrainedRequest& req = set.provenance.requests[static_cast<std::size_t>(r)];
    const std::vector<ReplayConfig> configs = {
        {"distillcache-initial", "", std::make_shared<const SampledPolicy>(initial, 1.0, 0, true), b},
        {"distillcache-final", "", std::make_shared<const SampledPolicy>(final_scorer, 1.0, 0, true), b}};
    const RequestResult res =
        Replayer(*readers[static_cast<std::size_t>(req.trace)], in.mode, configs, 0, o.rule).replay(req.id);
    for (int l = 0; l < set.geometry.n_layers; ++l) {
      before += weights[static_cast<std::size_t>(l)] * res.configs[0].layer_out_sq[static_cast<std::size_t>(l)] /
                static_cast<double>(eval.size());
      after += weights[static_cast<std::size_t>(l)] * res.configs[1].layer_out_sq[static_cast<std::size_t>(l)] /
               static_cast<double>(eval.size());
    }
  }
  return {before, after};
}

// The live model and task file the --reward live episodes run on, checked against the traces.
LiveTasks live_rewards(const TrainingSet& set, const TrainingInputs& in, const DistillCacheOptions& o,
                       const std::vector<int>& requests) {
  return open_live_tasks("train distillcache", set, requests, o.model, o.tasks,
                         reward_verify_options(in.mode, o.max_new, o.min_new, o.rule));
}

// Where an episode's rewards come from: replays of the traces (the trace reward, and the held-out
// report) or the live engine.
struct RewardSource {
  const TrainingSet& set;
  const TrainingInputs& in;
  const DistillCacheOptions& o;
  std::vector<std::unique_ptr<TraceReader>> readers;
  std::vector<double> weights;  // per layer: the estimator's, or the mean
  LiveTasks live;

  RewardSource(const TrainingSet& s, const TrainingInputs& inputs, const DistillCacheOptions& opts,
               const std::vector<int>& fit_requests)
      : set(s),
        in(inputs),
        o(opts),
        weights(reward_layer_weights("train distillcache", opts.estimator, s.geometry.n_layers, inputs.mode)) {
    for (const auto& path : in.traces) readers.push_back(std::make_unique<TraceReader>(path));
    if (o.reward == "live") live = live_rewards(set, in, o, fit_requests);
  }

  // Per step, the rewards of one (request, budget) episode's samples.
  EpisodeRewards run(int r, double budget, const std::vector<std::shared_ptr<const SampledPolicy>>& policies) const {
    const learned::TrainedRequest& req = set.provenance.requests[static_cast<std::size_t>(r)];
    std::vector<ReplayConfig> configs;
    for (const auto& p : policies) configs.push_back({"distillcache-sample", "", p, budget});
    EpisodeRewards ep;
    if (o.reward == "live") {
      const LiveRequestResult res = live.verifier->run(live.task(set, r), configs);
      ep.step_query = res.configs.front().step_query;
      ep.reward.resize(1);
      for (const LiveConfigResult& c : res.configs) {
        std::vector<double> step = c.step_kl;
        for (double& x : step) x = -x;
        ep.reward[0].push_back(std::move(step));
      }
      return ep;
    }
    Replayer replayer(*readers[static_cast<std::size_t>(req.trace)], in.mode, configs, 0, o.rule);
    replayer.record_steps(true);
    const RequestResult res = replayer.replay(req.id);
    ep.step_query = res.eval_positions;
    ep.reward.assign(weights.size(), {});
    for (std::size_t l = 0; l < weights.size(); ++l)
      for (const ConfigResult& c : res.configs) {
        std::vector<double> step = c.step_out_sq[l];
        for (double& x : step) x *= -weights[l];
        ep.reward[l].push_back(std::move(step));
      }
    return ep;
  }
};

// What the model file records of how it was trained.
std::string hyperparameters(const DistillCacheOptions& o, const std::vector<int>& sizes) {
  return nlohmann::json{{"hidden", sizes},
                        {"episodes", o.episodes},
                        {"samples", o.samples},
                        {"lr", o.lr},
                        {"temperature", o.temperature},
                        {"budgets", o.budgets},
                        {"reward", o.reward},
                        {"estimator", o.estimator},
                        {"init", o.init},
                        {"max_new", o.max_new},
                        {"min_new", o.min_new},
                        {"budget_semantics", o.rule.name()},
                        {"discount", o.discount},
                        {"credit", "return-to-go, per-step leave-one-out baseline"}}
      .dump();
}

}  // namespace

learned::LearnedModel train_distillcache(const TrainingSet& set, const TrainingInputs& in, const DistillCacheOptions& o,
                                         std::ostream& progress) {
  check_options(o);
  const ModelGeometry& g = set.geometry;
  std::vector<const HeadSample*> fit, held;
  split_held_out(set, fit, held);
  const std::shared_ptr<Scorer> scorer = initial_scorer(o, fit, g);
  const auto initial = std::make_shared<const Scorer>(*scorer);
  const std::vector<int> fit_requests = requests_of(fit), held_requests = requests_of(held);

  if (fit_requests.empty()) throw Error("train distillcache: no requests to train on");
  RewardSource rewards(set, in, o, fit_requests);

  learned::Adam adam(scorer->net.params().size(), o.lr);
  adam.clip_norm = 10.0;
  Rng rng(o.seed, 0x64697374);
  learned::TrainingCurve curve{o.reward == "trace" ? "reward_trace" : "reward_live", {}, {}};
  Progress bar(progress, "train distillcache", o.episodes, o.tty);
  std::vector<int> order = fit_requests;
  std::vector<double> grad;
  std::int64_t actions = 0, decode_actions = 0;  // all sampled (layer, head) actions; those after the compression point
  for (std::int64_t ep = 1; ep <= o.episodes; ++ep) {
    const auto pos = static_cast<std::size_t>((ep - 1) % static_cast<std::int64_t>(order.size()));
    if (pos == 0)  // a new pass over the requests, in a new order
      for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);
    const double budget = o.budgets[rng.below(o.budgets.size())];
    std::vector<std::shared_ptr<const SampledPolicy>> policies;
    const std::shared_ptr<const Scorer> now = std::make_shared<const Scorer>(*scorer);
    for (int k = 0; k < o.samples; ++k)
      policies.push_back(std::make_shared<const SampledPolicy>(
          now, o.temperature,
          splitmix64(o.seed ^ splitmix64(static_cast<std::uint64_t>(ep)) ^ splitmix64(~static_cast<std::uint64_t>(k))),
          false));
    const EpisodeRewards reward = rewards.run(order[pos], budget, policies);
    grad.assign(scorer->net.params().size(), 0.0);
    const double mean_reward =
        episode_gradient(*scorer, policies, reward, o.temperature, o.discount, grad, actions, decode_actions);
    adam.step(scorer->net.params(), grad);
    curve.step.push_back(static_cast<double>(ep));
    curve.value.push_back(mean_reward);
    bar.update(ep, "reward", mean_reward);
  }

  // Held-out check with the trace's estimate: the greedy policy (top tokens by score) before and
  // after training, at every budget.
  nlohmann::json results;
  results["reward"] = o.reward;
  results["budget_semantics"] = o.rule.name();
  results["actions"] = actions;
  results["decode_step_actions"] = decode_actions;
  progress << "train distillcache: " << actions << " sampled (layer, KV head) actions, " << decode_actions
           << " of them at decode steps (" << o.rule.name() << ")\n";
  results["evaluated_on"] = evaluated_on(!held_requests.empty());
  const std::vector<int>& eval = held_requests.empty() ? fit_requests : held_requests;
  const auto final_scorer = std::make_shared<const Scorer>(*scorer);
  for (double b : o.budgets) {
    const auto [before, after] =
        greedy_estimates(set, in, o, rewards.readers, rewards.weights, eval, b, initial, final_scorer);
    const std::string k = std::to_string(static_cast<int>(std::lround(b * 100)));
    results["estimate_initial_" + k] = before;
    results["estimate_final_" + k] = after;
    progress << "train distillcache: budget " << b << ", offline estimate " << before << " before training, " << after
             << " after (" << results["evaluated_on"].get<std::string>() << ")\n";
  }
  results["train_seconds"] = bar.elapsed();

  learned::LearnedModel m =
      scorer_model("distillcache", set, scorer->net, scorer->mean, scorer->sd, std::move(curve), o.seed);
  m.provenance.hyperparameters = hyperparameters(o, m.network.sizes());
  m.results = results.dump();
  return m;
}

}  // namespace kvsim::train
