#pragma once
// Zipf popularity: the k-th most popular of n items drawn with weight 1 / (k + 1)^s. Shared by the
// chunked workloads of capture (capture/chunked_tasks.h) and serving (serve/chunk_workload.h).
#include <cstdint>
#include <vector>

#include "core/rng.h"

namespace kvsim {

std::vector<double> zipf_cdf(std::int64_t n, double s);            // cumulative weights, the last 1
std::int64_t zipf_draw(double u, const std::vector<double>& cdf);  // the rank for a uniform u in [0, 1)

// Items 0..n-1 drawn with Zipf popularity over a random order of them (shuffled from `rng` when
// built), so the most popular item is not always the first.
class ZipfPicker {
 public:
  ZipfPicker(std::int64_t n, double s, Rng& rng);
  std::int64_t draw(Rng& rng) const;
  // k distinct items, in draw order (k <= n).
  std::vector<std::int64_t> distinct(Rng& rng, int k) const;

 private:
  std::vector<std::int64_t> by_rank_;
  std::vector<double> cdf_;
};

}  // namespace kvsim
