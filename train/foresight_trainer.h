#pragma once
// `kvsim train foresight`: a per-token scorer fitted by a pairwise hinge loss to the golden
// eviction label (oracle_golden), as ForesightKV's supervised stage (docs/learned.md).
#include <cstdint>
#include <iosfwd>
#include <vector>

#include "learned/model_file.h"
#include "train/training_set.h"

namespace kvsim::train {

struct ForesightOptions : ScorerTraining {
  int pairs_per_head = 256;
  double margin = 1.0;      // hinge margin on the score difference
  double top_share = 0.25;  // the better token of a pair comes from this top share by label
};

// Mean share of each head's golden top-`share` tokens that a scorer's top-`share` also holds.
double top_overlap(const std::vector<const HeadSample*>& heads, const std::vector<std::vector<float>>& scores,
                   double share);

learned::LearnedModel train_foresight(const TrainingSet& set, const ForesightOptions& o, std::ostream& progress);

}  // namespace kvsim::train
