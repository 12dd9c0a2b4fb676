#pragma once
// Credit for a sequence of eviction decisions rewarded per step (DistillCache's REINFORCE; the MDP
// is in docs/learned.md). An action taken when the cache held n tokens can change only the steps
// whose query belongs to a token at or after n, so it is credited with the discounted return from
// its first such step on (return-to-go), less the other samples' return from that same step (a
// per-step leave-one-out baseline over the samples of one request and budget).
#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvsim::train {

// G_t = sum over u >= t of discount^(u - t) r_u, for t = 0 .. steps (G_steps = 0).
std::vector<double> returns_to_go(const std::vector<double>& rewards, double discount);

// The first step an action at cache size n can affect: the first whose query token is >= n
// (step_query ascending); step_query.size() when none is.
std::size_t first_affected_step(const std::vector<std::int64_t>& step_query, std::int64_t n);

class StepCredit {
 public:
  // rewards[k][t]: sample k's reward at step t. At least 2 samples, each with the same number of
  // steps; discount in [0, 1]. Throws otherwise.
  StepCredit(const std::vector<std::vector<double>>& rewards, double discount);
  std::size_t steps() const { return steps_; }
  double return_from(std::size_t sample, std::size_t step) const;
  // Sample k's return from `step` less the mean of the other samples' returns from it; 0 from the
  // last step on (an action there changes nothing that was measured).
  double advantage(std::size_t sample, std::size_t step) const;

 private:
  std::size_t steps_ = 0;
  std::vector<std::vector<double>> returns_;  // [sample][step + 1]
  std::vector<double> total_;                 // [step + 1] over the samples
};

}  // namespace kvsim::train
