#pragma once
// Zipf popularity: the k-th most popular of n items drawn with weight 1 / (k + 1)^s. Shared by the
// chunked workloads of capture (capture/chunked_tasks.h) and serving (serve/chunk_workload.h).
#include <cstdint>
#include <vector>

namespace kvsim {

std::vector<double> zipf_cdf(std::int64_t n, double s);            // cumulative weights, the last 1
std::int64_t zipf_draw(double u, const std::vector<double>& cdf);  // the rank for a uniform u in [0, 1)

}  // namespace kvsim
