#pragma once
// `kvsim train sigmoid_gate`: per-token gates g = sigmoid(MLP(token features)) trained soft: log g
// is added to the attention logits of the evaluation queries, the loss is the relative squared
// attention-output error against the full cache plus a capacity penalty on the mean gate. Deployed
// hard (the policy keeps the top tokens by g), so training also reports the soft-to-hard gap:
// offline on the held-out requests' attention outputs, and, given a model and task file, live
// (the engine runs the soft-gated cache, sigmoid_gate:soft=1, against the hard deletion).
#include <cstdint>
#include <iosfwd>
#include <span>
#include <vector>

#include "learned/model_file.h"
#include "train/training_set.h"

namespace kvsim::train {

struct SigmoidGateOptions : ScorerTraining {
  double capacity = 0.25;    // the mean gate the penalty allows without cost
  double penalty = 10.0;     // weight of max(0, mean(g) - capacity)^2
  std::string model, tasks;  // live gap: the GGUF the traces were captured from, their task file
  int max_new = 16;          // live gap: continuation length
};

// Relative squared error of a sample's attention output when token j's attention is scaled by
// gate[j] and renormalised over the cached tokens, mean over its rows (|o'-o|^2 / |o|^2). With
// grad: dError/dgate (size tokens), added to.
double gated_output_error(const HeadSample& h, std::span<const double> gate, std::vector<double>* grad = nullptr);

learned::LearnedModel train_sigmoid_gate(const TrainingSet& set, const TrainingInputs& in, const SigmoidGateOptions& o,
                                         std::ostream& progress);

}  // namespace kvsim::train
