#pragma once
// The requests a trainer learns from: head samples (head_samples.h) of every chosen request of
// every trace, the model geometry they share, and the provenance the model file records.
#include <iosfwd>
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
  std::string labeler;             // the policy spec the labels came from
};

// Reads every chosen request; progress lines go to `progress`. Throws naming the trace when the
// traces disagree on geometry or a named request is in none of them.
TrainingSet load_training_set(const TrainingInputs& in, std::ostream& progress);

// Per-feature mean and standard deviation over every token of every sample (a constant feature
// gets std 1).
void feature_moments(const std::vector<const HeadSample*>& heads, std::vector<double>& mean, std::vector<double>& std_dev);

// Samples to fit and samples held out: with at least five requests the last fifth of them are
// held out (for the figures a trainer prints), else none.
void split_held_out(const TrainingSet& set, std::vector<const HeadSample*>& fit, std::vector<const HeadSample*>& held);

// UTC now, ISO 8601.
std::string utc_now();

}  // namespace kvsim::train
