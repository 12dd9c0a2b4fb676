#include "train/plackett_luce.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace kvsim::train {

std::vector<std::int64_t> sample_top_k(std::span<const double> s, std::int64_t k, double tau, Rng& rng) {
  const auto n = static_cast<std::int64_t>(s.size());
  std::vector<double> key(s.size());
  for (std::size_t j = 0; j < s.size(); ++j) {
    double u = rng.uniform();
    while (u <= 0.0) u = rng.uniform();
    key[j] = s[j] / tau - std::log(-std::log(u));
  }
  std::vector<std::int64_t> idx(s.size());
  std::iota(idx.begin(), idx.end(), std::int64_t{0});
  k = std::min(k, n);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](std::int64_t a, std::int64_t b) {
    return key[static_cast<std::size_t>(a)] != key[static_cast<std::size_t>(b)] ? key[static_cast<std::size_t>(a)] > key[static_cast<std::size_t>(b)]
                                                                               : a > b;
  });
  idx.resize(static_cast<std::size_t>(k));
  return idx;
}

double pl_log_prob(std::span<const double> s, std::span<const std::int64_t> chosen, double tau, std::vector<double>* grad) {
  const std::size_t n = s.size();
  const double top = *std::max_element(s.begin(), s.end()) / tau;
  std::vector<double> e(n);
  double z = 0;
  for (std::size_t j = 0; j < n; ++j) z += e[j] = std::exp(s[j] / tau - top);
  // Step t picks chosen[t] from what remains; inv[t] = sum over steps <= t of 1 / Z_step.
  std::vector<double> inv(chosen.size());
  std::vector<std::int64_t> step_of(n, -1);
  double lp = 0, acc = 0;
  for (std::size_t t = 0; t < chosen.size(); ++t) {
    const auto j = static_cast<std::size_t>(chosen[t]);
    lp += s[j] / tau - top - std::log(z);
    acc += 1.0 / z;
    inv[t] = acc;
    step_of[j] = static_cast<std::int64_t>(t);
    z -= e[j];
    if (z < 0) z = 0;  // rounding, at the last token
  }
  if (grad) {
    grad->assign(n, 0.0);
    // d lp / d s_j = (1/tau) [1{chosen} - e_j * sum over the steps at which j remained of 1/Z].
    for (std::size_t j = 0; j < n; ++j) {
      const std::int64_t t = step_of[j];
      const double remained = chosen.empty() ? 0.0 : (t >= 0 ? inv[static_cast<std::size_t>(t)] : inv.back());
      (*grad)[j] = ((t >= 0 ? 1.0 : 0.0) - e[j] * remained) / tau;
    }
  }
  return lp;
}

}  // namespace kvsim::train
