#pragma once
// `kvsim train rlkv`: one gate per (layer, KV head) choosing the whole cache or sinks + recent
// tokens, learned on the per-head proxy (the attention-output error a streaming head would make,
// head_samples.h) with a sparsity term; and an importer for RLKV's released adapter_weights.tsv.
#include <cstdint>
#include <iosfwd>
#include <string>

#include "learned/model_file.h"
#include "train/training_set.h"

namespace kvsim::train {

struct RlkvOptions {
  std::int64_t steps = 500;
  double lr = 0.05;
  double sparsity = 1.0;      // lambda: a head's gate opens when its error exceeds lambda x the mean error
  int requests_per_step = 4;  // requests sampled (with replacement) per Adam step
  std::uint64_t seed = 1;
  bool tty = false;
};

// Gates g = sigmoid(theta) minimise mean[(1 - g) e / mean(e)] + lambda mean(g) over the sampled
// requests' per-head errors e (docs/learned.md).
learned::LearnedModel train_rlkv(const TrainingSet& set, const RlkvOptions& o, std::ostream& progress);

// RLKV's adapter_weights.tsv: one line per layer, one tab-separated gate per KV head, for the
// model geometry `g` (read from a trace of that model). Errors name the file, line and column.
learned::LearnedModel import_rlkv_tsv(const std::string& path, const ModelGeometry& g, const std::string& trace);

}  // namespace kvsim::train
