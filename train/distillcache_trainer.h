#pragma once
// `kvsim train distillcache`: eviction as a sequential decision problem (DistillCache), learned by
// REINFORCE. The policy network scores tokens from their features; an action is the budget's
// tokens drawn by Plackett-Luce from those scores (plackett_luce.h) in every (layer, KV head) at
// the compression point and, under peak semantics (`rule`), at every decode step where the policy
// re-applies its rule to stay within the budget. The reward comes per step t of the continuation:
//   --reward trace: minus the offline estimate of KL_t, est_kl's per-layer weights (--estimator;
//                   else the mean over layers) on each layer's squared output error at step t,
//                   credited per layer (replay is teacher-forced);
//   --reward live:  minus the live engine's KL_t(full || compressed), shared by every layer.
// Each action is credited with the return from the first step it can change, less the other
// samples' return from that step (step_credit.h); the MDP is in docs/learned.md.
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "kvcache/budget.h"
#include "learned/model_file.h"
#include "train/training_set.h"

namespace kvsim::train {

struct DistillCacheOptions {
  std::vector<int> hidden = {32, 32};
  learned::Activation activation = learned::Activation::Tanh;
  std::int64_t episodes = 200;  // (request, budget) draws; each runs `samples` sampled plans
  int samples = 4;
  double lr = 3e-3;
  double temperature = 1.0;
  std::vector<double> budgets = {0.1, 0.25, 0.5};
  std::string reward = "trace";  // trace | live
  std::string estimator;         // trace: a kvsim calibrate file (else the mean over layers)
  std::string init;              // a foresight or distillcache model to start from
  std::string model, tasks;      // live: the GGUF model and the task file of the traces' requests
  int max_new = 16;              // live: continuation length
  int min_new = 0;               // live: no end of generation before this many tokens
  // Credit: an action's return from the first step it can change, discounted by this per step
  // (1: every later step counts fully, as the objective, the mean KL over the continuation, does).
  double discount = 1.0;
  BudgetRule rule;  // peak: actions at decode steps too (re-applied every rule.every tokens)
  std::uint64_t seed = 1;
  bool tty = false;
};

learned::LearnedModel train_distillcache(const TrainingSet& set, const TrainingInputs& in, const DistillCacheOptions& o,
                                         std::ostream& progress);

}  // namespace kvsim::train
