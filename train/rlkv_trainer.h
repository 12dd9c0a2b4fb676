#pragma once
// `kvsim train rlkv`: one gate per (layer, KV head) choosing the whole cache or sinks + recent
// tokens, learned as RLKV learns it: by reinforcement over sampled head masks with an L1 sparsity
// term on the gates. Each step draws `samples` masks m ~ Bernoulli(sigmoid(theta)) for one
// training request; the reward of a mask is minus the KL its cache causes over the continuation:
//   --reward trace: the offline estimate (est_kl's layer weights with --estimator, else the mean
//                   over layers), credited per layer (replay is teacher-forced: a layer's heads
//                   change only its own error);
//   --reward live:  the live engine's mean next-token KL, shared by every head.
// REINFORCE with the other samples' mean reward as baseline, plus -lambda * sum(gates), where
// lambda is --sparsity times the all-streaming KL per head (docs/learned.md). Also an importer for
// RLKV's released adapter_weights.tsv.
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "learned/model_file.h"
#include "train/training_set.h"

namespace kvsim::train {

struct RlkvOptions {
  std::int64_t steps = 200;
  double lr = 0.05;
  // A gate opens when keeping its head whole saves more KL than this x the mean head's share of
  // the all-streaming KL.
  double sparsity = 1.0;
  int samples = 4;               // head masks per step (the baseline is the others' reward)
  std::string reward = "trace";  // trace | live
  std::string estimator;         // trace: a kvsim calibrate file (else the mean over layers)
  std::string model, tasks;      // live: the GGUF model and the task file of the traces' requests
  int max_new = 16;              // live: continuation length
  int min_new = 0;               // live: no end of generation before this many tokens
  std::uint64_t seed = 1;
  bool tty = false;
};

// Gates from REINFORCE over the training requests of `set` (the traces and mode of `in`; its
// streaming window is the masked heads' cache).
learned::LearnedModel train_rlkv(const TrainingSet& set, const TrainingInputs& in, const RlkvOptions& o,
                                 std::ostream& progress);

// The offline KL estimate (--estimator's weights, else the mean over layers) of each head mask
// (1: the head keeps its whole cache, 0: its streaming window), averaged over the training
// requests of `set`.
std::vector<double> mask_estimates(const TrainingSet& set, const TrainingInputs& in, const std::string& estimator,
                                   const std::vector<std::vector<std::uint8_t>>& masks);

// RLKV's adapter_weights.tsv: one line per layer, one tab-separated gate per KV head, for the
// model geometry `g` (read from a trace of that model). Errors name the file, line and column.
learned::LearnedModel import_rlkv_tsv(const std::string& path, const ModelGeometry& g, const std::string& trace);

}  // namespace kvsim::train
