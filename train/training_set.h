#pragma once
// The requests a trainer learns from: head samples (head_samples.h) of every chosen request of
// every trace, the model geometry they share, and the provenance the model file records.
#include <algorithm>
#include <cstdint>
#include <iosfwd>
#include <numeric>
#include <string>
#include <vector>

#include "kvcache/config.h"
#include "learned/model_file.h"
#include "train/head_samples.h"

namespace kvsim::train {

struct TrainingInputs {
  std::vector<std::string> traces;
  std::vector<std::string> requests;  // request ids to train on; empty: every complete request
  ReplayMode mode = ReplayMode::QueryAware;
  SampleOptions samples;  // the label, rlkv's streaming window, sigmoid_gate's attention rows
};

struct TrainingSet {
  std::vector<HeadSample> heads;
  ModelGeometry geometry;
  learned::Provenance provenance;  // traces (with sha256) and requests; seed and hyperparameters left to the trainer
  int requests = 0;
  std::string labeler;            // the policy spec the labels came from
  std::int64_t decode_block = 0;  // > 0: labels also at every decode block of this many tokens (SampleOptions)
};

// Reads every chosen request; progress lines go to `progress`. Throws naming the trace when the
// traces disagree on geometry or a named request is in none of them.
TrainingSet load_training_set(const TrainingInputs& in, std::ostream& progress);

// Per-feature mean and standard deviation over every token of every sample (a constant feature
// gets std 1).
void feature_moments(const std::vector<const HeadSample*>& heads, std::vector<double>& mean,
                     std::vector<double>& std_dev);

// Samples to fit and samples held out: with at least five requests the last fifth of them are
// held out (for the figures a trainer prints), else none.
void split_held_out(const TrainingSet& set, std::vector<const HeadSample*>& fit, std::vector<const HeadSample*>& held);

// The distinct requests of the samples, in their order (split_held_out's parts as request indices).
std::vector<int> requests_of(const std::vector<const HeadSample*>& samples);

// UTC now, ISO 8601.
std::string utc_now();

// What a trainer's held-out figures were measured on (split_held_out's held part, or, when it
// held none out, the training requests).
const char* evaluated_on(bool held_out);

// The network sizes of a token scorer: the features, `hidden`, one score.
std::vector<int> scorer_sizes(const std::vector<int>& hidden);

// Raw features [rows, kFeatureCount] standardised with a model's mean and std, in double (the
// training precision; learned::standardize is the policies' float form).
std::vector<double> standardized(const std::vector<float>& raw, std::int64_t rows, const std::vector<double>& mean,
                                 const std::vector<double>& std_dev);

// What every gradient-trained token scorer (foresight, sigmoid_gate) is trained with: the network,
// the optimiser's steps, its batch of heads, the seed.
struct ScorerTraining {
  std::vector<int> hidden = {32, 32};
  learned::Activation activation = learned::Activation::Tanh;
  std::int64_t steps = 400;
  double lr = 3e-3;
  int heads_per_step = 8;  // (request, layer, KV head) samples per Adam step
  std::uint64_t seed = 1;
  bool tty = false;  // progress line rewritten in place
};
// Its hyperparameters as a model file records them, with a trainer's own `extra` fields.
std::string scorer_hyperparameters(const ScorerTraining& o, const std::string& extra_json);

// A token-scoring model of `method` (foresight, sigmoid_gate, distillcache) complete but for its
// hyperparameters and results: features, the training set's geometry and provenance, the seed.
learned::LearnedModel scorer_model(const std::string& method, const TrainingSet& set, learned::Mlp net,
                                   std::vector<double> mean, std::vector<double> std_dev, learned::TrainingCurve curve,
                                   std::uint64_t seed);

// Indices of the k largest values, largest first (ties: the higher index, top_k_mask's rule);
// k is clamped to the size.
template <typename T>
std::vector<std::int64_t> top_indices(const std::vector<T>& v, std::int64_t k) {
  std::vector<std::int64_t> idx(v.size());
  std::iota(idx.begin(), idx.end(), std::int64_t{0});
  k = std::clamp<std::int64_t>(k, 0, static_cast<std::int64_t>(v.size()));
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](std::int64_t a, std::int64_t b) {
    const T x = v[static_cast<std::size_t>(a)], y = v[static_cast<std::size_t>(b)];
    return x != y ? x > y : a > b;
  });
  idx.resize(static_cast<std::size_t>(k));
  return idx;
}

}  // namespace kvsim::train
