#include "train/foresight_trainer.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <numeric>
#include <ostream>

#include "core/error.h"
#include "core/rng.h"
#include "learned/features.h"
#include "learned/token_scorer.h"
#include "train/progress.h"

namespace kvsim::train {

namespace {

std::vector<std::vector<float>> score_heads(const learned::Mlp& net, const std::vector<const HeadSample*>& heads,
                                            const std::vector<double>& mean, const std::vector<double>& sd) {
  std::vector<std::vector<float>> out;
  for (const HeadSample* h : heads) {
    std::vector<float> x = h->x;  // in float, as the policy scores
    learned::standardize(x, h->tokens, mean, sd);
    out.push_back(net.forward(x.data(), h->tokens));
  }
  return out;
}

// One Adam step's batch: standardised rows of the sampled tokens and the pairs over them.
struct Batch {
  std::vector<double> x;
  std::vector<std::pair<std::int64_t, std::int64_t>> pairs;  // (better row, worse row)
  std::int64_t rows = 0;
};

Batch sample_batch(const std::vector<const HeadSample*>& fit, const std::vector<std::vector<std::int64_t>>& order,
                   const std::vector<double>& mean, const std::vector<double>& sd, const ForesightOptions& o,
                   Rng& rng) {
  const int F = learned::kFeatureCount;
  Batch b;
  auto add_row = [&](const HeadSample& h, std::int64_t t) {
    for (int c = 0; c < F; ++c)
      b.x.push_back((h.x[static_cast<std::size_t>(t * F + c)] - mean[static_cast<std::size_t>(c)]) /
                    sd[static_cast<std::size_t>(c)]);
    return b.rows++;
  };
  for (int k = 0; k < o.heads_per_step; ++k) {
    const std::size_t hi = rng.below(fit.size());
    const HeadSample& h = *fit[hi];
    const auto& ord = order[hi];
    const auto top = std::max<std::int64_t>(1, static_cast<std::int64_t>(o.top_share * static_cast<double>(h.tokens)));
    for (int p = 0; p < o.pairs_per_head; ++p) {
      std::int64_t a = ord[rng.below(static_cast<std::uint64_t>(top))];
      std::int64_t c = static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(h.tokens)));
      float la = h.label[static_cast<std::size_t>(a)], lc = h.label[static_cast<std::size_t>(c)];
      if (std::abs(la - lc) <= 1e-3f * std::max(std::abs(la), std::abs(lc)) + 1e-9f) continue;  // no order to learn
      if (lc > la) std::swap(a, c);
      const std::int64_t ra = add_row(h, a), rc = add_row(h, c);
      b.pairs.emplace_back(ra, rc);
    }
  }
  return b;
}

// Distinct (request, point) pairs the labels were taken at.
std::int64_t decision_points(const TrainingSet& set) {
  std::vector<std::pair<int, std::int64_t>> seen;
  for (const HeadSample& h : set.heads) seen.emplace_back(h.request, h.point);
  std::sort(seen.begin(), seen.end());
  return std::unique(seen.begin(), seen.end()) - seen.begin();
}

}  // namespace

double top_overlap(const std::vector<const HeadSample*>& heads, const std::vector<std::vector<float>>& scores,
                   double share) {
  double sum = 0;
  for (std::size_t i = 0; i < heads.size(); ++i) {
    const auto k = std::max<std::int64_t>(1, static_cast<std::int64_t>(share * static_cast<double>(heads[i]->tokens)));
    auto want = top_indices(heads[i]->label, k), got = top_indices(scores[i], k);
    std::sort(want.begin(), want.end());
    std::sort(got.begin(), got.end());
    std::vector<std::int64_t> both;
    std::set_intersection(want.begin(), want.end(), got.begin(), got.end(), std::back_inserter(both));
    sum += static_cast<double>(both.size()) / static_cast<double>(k);
  }
  return heads.empty() ? 0.0 : sum / static_cast<double>(heads.size());
}

learned::LearnedModel train_foresight(const TrainingSet& set, const ForesightOptions& o, std::ostream& progress) {
  if (o.steps < 1 || o.heads_per_step < 1 || o.pairs_per_head < 1 || !(o.lr > 0) ||
      !(o.top_share > 0 && o.top_share <= 1))
    throw Error("train foresight: --steps, --heads-per-step, --pairs must be >= 1, --lr > 0, --top-share in (0, 1]");
  std::vector<const HeadSample*> fit, held;
  split_held_out(set, fit, held);
  if (fit.empty()) throw Error("train foresight: no samples to fit");
  std::vector<double> mean, sd;
  feature_moments(fit, mean, sd);
  std::vector<std::vector<std::int64_t>> order;
  for (const HeadSample* h : fit) order.push_back(top_indices(h->label, h->tokens));

  learned::Mlp net(scorer_sizes(o.hidden), o.activation, o.seed);
  learned::Adam adam(net.params().size(), o.lr);
  adam.clip_norm = 10.0;
  Rng rng(o.seed, 0x666f7265);
  learned::TrainingCurve curve{"pairwise_hinge", {}, {}};
  Progress bar(progress, "train foresight", o.steps, o.tty);
  std::vector<double> grad;
  for (std::int64_t step = 1; step <= o.steps; ++step) {
    const Batch b = sample_batch(fit, order, mean, sd, o, rng);
    if (b.pairs.empty()) continue;
    learned::Mlp::Tape tape;
    const std::vector<double> y = net.forward(b.x.data(), b.rows, &tape);
    std::vector<double> dy(static_cast<std::size_t>(b.rows), 0.0);
    const double w = 1.0 / static_cast<double>(b.pairs.size());
    double loss = 0;
    for (const auto& [ra, rc] : b.pairs) {
      const double m = o.margin - (y[static_cast<std::size_t>(ra)] - y[static_cast<std::size_t>(rc)]);
      if (m <= 0) continue;
      loss += m * w;
      dy[static_cast<std::size_t>(ra)] -= w;
      dy[static_cast<std::size_t>(rc)] += w;
    }
    grad.assign(net.params().size(), 0.0);
    net.backward(tape, dy.data(), grad);
    adam.step(net.params(), grad);
    curve.step.push_back(static_cast<double>(step));
    curve.value.push_back(loss);
    bar.update(step, "hinge", loss);
  }

  const auto& eval = held.empty() ? fit : held;
  const auto learned_scores = score_heads(net, eval, mean, sd);
  std::vector<std::vector<float>> window_scores;  // SnapKV-like baseline: mean attention of the last 32 queries
  const int window = learned::feature_index("attn_mean_32");
  for (const HeadSample* h : eval) {
    std::vector<float> s(static_cast<std::size_t>(h->tokens));
    for (std::int64_t i = 0; i < h->tokens; ++i)
      s[static_cast<std::size_t>(i)] = h->x[static_cast<std::size_t>(i * learned::kFeatureCount + window)];
    window_scores.push_back(std::move(s));
  }
  nlohmann::json results;
  results["evaluated_on"] = evaluated_on(!held.empty());
  for (double share : {0.1, 0.25, 0.5}) {
    const std::string key = std::to_string(static_cast<int>(share * 100));
    results["golden_overlap_" + key] = top_overlap(eval, learned_scores, share);
    results["window32_overlap_" + key] = top_overlap(eval, window_scores, share);
  }
  results["train_seconds"] = bar.elapsed();
  results["labels"] = set.decode_block > 0 ? "per decode block of " + std::to_string(set.decode_block) + " tokens"
                                           : std::string("one-shot, at the compression point");
  results["decision_points"] = decision_points(set);
  progress << "train foresight: golden top-25% overlap " << results["golden_overlap_25"].get<double>()
           << " (window-32 attention alone: " << results["window32_overlap_25"].get<double>() << ") on "
           << results["evaluated_on"].get<std::string>() << "\n";

  learned::LearnedModel m = scorer_model("foresight", set, std::move(net), mean, sd, std::move(curve), o.seed);
  m.provenance.hyperparameters = scorer_hyperparameters(o, nlohmann::json{{"pairs_per_head", o.pairs_per_head},
                                                                          {"margin", o.margin},
                                                                          {"top_share", o.top_share},
                                                                          {"labeler", set.labeler},
                                                                          {"decode_block", set.decode_block}}
                                                               .dump());
  m.results = results.dump();
  return m;
}

}  // namespace kvsim::train
