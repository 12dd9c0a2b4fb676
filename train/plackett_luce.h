#pragma once
// Plackett-Luce choices of k of n tokens, the action distribution of `kvsim train distillcache`:
// sampled by the Gumbel-top-k trick, with the log-probability of the ordered choice and its exact
// gradient with respect to the scores (O(n + k)).
#include <cstdint>
#include <span>
#include <vector>

#include "core/rng.h"

namespace kvsim::train {

// k token indices, in the order a Plackett-Luce draw at temperature tau picks them (scores s / tau
// + Gumbel noise, the top k). k >= n returns every index by decreasing perturbed score.
std::vector<std::int64_t> sample_top_k(std::span<const double> s, std::int64_t k, double tau, Rng& rng);

// log P(chosen, in that order) under Plackett-Luce(s / tau); with grad, d/ds of it (size n,
// overwritten).
double pl_log_prob(std::span<const double> s, std::span<const std::int64_t> chosen, double tau,
                   std::vector<double>* grad);

}  // namespace kvsim::train
