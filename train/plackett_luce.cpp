#include "train/plackett_luce.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace kvsim::train {

namespace {

double logaddexp(double a, double b) {
  if (a == -std::numeric_limits<double>::infinity()) return b;
  if (b == -std::numeric_limits<double>::infinity()) return a;
  const double m = std::max(a, b);
  return m + std::log1p(std::exp(-std::abs(a - b)));
}

}  // namespace

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
  k = std::clamp<std::int64_t>(k, 0, n);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](std::int64_t a, std::int64_t b) {
    return key[static_cast<std::size_t>(a)] != key[static_cast<std::size_t>(b)]
               ? key[static_cast<std::size_t>(a)] > key[static_cast<std::size_t>(b)]
               : a > b;
  });
  idx.resize(static_cast<std::size_t>(k));
  return idx;
}

// In log space throughout: a running total of exp(s / tau) minus the picked tokens' terms loses
// every digit once the picks hold nearly all the weight (score gaps of ~37 tau).
double pl_log_prob(std::span<const double> s, std::span<const std::int64_t> chosen, double tau,
                   std::vector<double>* grad) {
  const std::size_t n = s.size(), k = chosen.size();
  if (grad) grad->assign(n, 0.0);
  if (n == 0 || k == 0) return 0.0;
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  std::vector<std::int64_t> step_of(n, -1);
  for (std::size_t t = 0; t < k; ++t) step_of[static_cast<std::size_t>(chosen[t])] = static_cast<std::int64_t>(t);
  // log Z_t: the normaliser before pick t, from the tokens never picked backwards.
  std::vector<double> log_z(k + 1, kNegInf);
  for (std::size_t j = 0; j < n; ++j)
    if (step_of[j] < 0) log_z[k] = logaddexp(log_z[k], s[j] / tau);
  for (std::size_t t = k; t-- > 0;) log_z[t] = logaddexp(log_z[t + 1], s[static_cast<std::size_t>(chosen[t])] / tau);
  double lp = 0;
  for (std::size_t t = 0; t < k; ++t) lp += s[static_cast<std::size_t>(chosen[t])] / tau - log_z[t];
  if (grad) {
    // d lp / d s_j = (1/tau) [1{chosen} - sum over the picks at which j remained of exp(s_j/tau) / Z_t];
    // log_inv[t] = log sum_{m <= t} 1 / Z_m.
    std::vector<double> log_inv(k);
    double acc = kNegInf;
    for (std::size_t t = 0; t < k; ++t) log_inv[t] = acc = logaddexp(acc, -log_z[t]);
    for (std::size_t j = 0; j < n; ++j) {
      const std::int64_t t = step_of[j];
      const double remained = std::exp(s[j] / tau + log_inv[t >= 0 ? static_cast<std::size_t>(t) : k - 1]);
      (*grad)[j] = ((t >= 0 ? 1.0 : 0.0) - remained) / tau;
    }
  }
  return lp;
}

}  // namespace kvsim::train
