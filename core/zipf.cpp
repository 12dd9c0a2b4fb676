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

}  // namespace kvsim
