#include "core/zipf.h"

#include <algorithm>
#include <cmath>

namespace kvsim {

std::vector<double> zipf_cdf(std::int64_t n, double s) {
  std::vector<double> cdf(static_cast<std::size_t>(n));
  double sum = 0;
  for (std::int64_t k = 0; k < n; ++k)
    cdf[static_cast<std::size_t>(k)] = sum += std::pow(static_cast<double>(k + 1), -s);
  for (double& c : cdf) c /= sum;
  return cdf;
}

std::int64_t zipf_draw(double u, const std::vector<double>& cdf) {
  const auto it = std::upper_bound(cdf.begin(), cdf.end(), u);
  return std::min<std::int64_t>(it - cdf.begin(), static_cast<std::int64_t>(cdf.size()) - 1);
}

ZipfPicker::ZipfPicker(std::int64_t n, double s, Rng& rng)
    : by_rank_(static_cast<std::size_t>(n)), cdf_(zipf_cdf(n, s)) {
  for (std::size_t i = 0; i < by_rank_.size(); ++i) by_rank_[i] = static_cast<std::int64_t>(i);
  for (std::size_t i = by_rank_.size(); i > 1; --i) std::swap(by_rank_[i - 1], by_rank_[rng.below(i)]);
}

std::int64_t ZipfPicker::draw(Rng& rng) const {
  return by_rank_[static_cast<std::size_t>(zipf_draw(rng.uniform(), cdf_))];
}

std::vector<std::int64_t> ZipfPicker::distinct(Rng& rng, int k) const {
  std::vector<std::int64_t> picked;
  while (static_cast<int>(picked.size()) < k) {
    const std::int64_t x = draw(rng);
    if (std::find(picked.begin(), picked.end(), x) == picked.end()) picked.push_back(x);
  }
  return picked;
}

}  // namespace kvsim
