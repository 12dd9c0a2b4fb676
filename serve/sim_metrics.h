#pragma once
// Samples of the timed simulation's latencies, reduced to percentiles at the end. Weighted, since
// one decode step gives every sequence in it the same time between tokens.
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "serve/simulator.h"

namespace kvsim::serve::detail {

class WeightedSamples {
 public:
  void add(double value, std::int64_t weight = 1) {
    if (weight > 0) samples_.emplace_back(value, weight);
  }
  // Nearest rank over the weights: the smallest value with at least q of the weight at or below it.
  Percentiles percentiles() {
    Percentiles p;
    if (samples_.empty()) return p;
    std::sort(samples_.begin(), samples_.end());
    double total = 0, sum = 0;
    for (const auto& [v, w] : samples_) {
      total += static_cast<double>(w);
      sum += v * static_cast<double>(w);
    }
    p.mean = sum / total;
    p.count = static_cast<std::int64_t>(total);
    auto at = [&](double q) {
      double seen = 0;
      for (const auto& [v, w] : samples_)
        if ((seen += static_cast<double>(w)) >= q * total) return v;
      return samples_.back().first;
    };
    p.p50 = at(0.5);
    p.p90 = at(0.9);
    p.p99 = at(0.99);
    return p;
  }
  // The 0th, 1st, ..., 100th percentiles (nearest rank; call after percentiles()): a CDF to plot.
  std::vector<double> centiles() const {
    std::vector<double> out;
    if (samples_.empty()) return out;
    double total = 0;
    for (const auto& s : samples_) total += static_cast<double>(s.second);
    std::size_t i = 0;
    double seen = static_cast<double>(samples_[0].second);
    for (int q = 0; q <= 100; ++q) {
      while (seen < q / 100.0 * total && i + 1 < samples_.size()) seen += static_cast<double>(samples_[++i].second);
      out.push_back(samples_[i].first);
    }
    return out;
  }

 private:
  std::vector<std::pair<double, std::int64_t>> samples_;
};

struct MetricSamples {
  WeightedSamples ttft, tbt, queue;
};

}  // namespace kvsim::serve::detail
