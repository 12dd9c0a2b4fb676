#include "train/step_credit.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace kvsim::train {

std::vector<double> returns_to_go(const std::vector<double>& rewards, double discount) {
  std::vector<double> g(rewards.size() + 1, 0.0);
  for (std::size_t t = rewards.size(); t-- > 0;) g[t] = rewards[t] + discount * g[t + 1];
  return g;
}

std::size_t first_affected_step(const std::vector<std::int64_t>& step_query, std::int64_t n) {
  return static_cast<std::size_t>(std::lower_bound(step_query.begin(), step_query.end(), n) - step_query.begin());
}

StepCredit::StepCredit(const std::vector<std::vector<double>>& rewards, double discount) {
  if (rewards.size() < 2) throw Error("step credit: the baseline needs at least 2 samples");
  if (!(discount >= 0 && discount <= 1))
    throw Error("step credit: discount " + std::to_string(discount) + " is not in [0, 1]");
  steps_ = rewards.front().size();
  total_.assign(steps_ + 1, 0.0);
  for (const auto& r : rewards) {
    if (r.size() != steps_)
      throw Error("step credit: samples of one episode differ in steps (" + std::to_string(r.size()) + " and " +
                  std::to_string(steps_) + ")");
    returns_.push_back(returns_to_go(r, discount));
    for (std::size_t t = 0; t <= steps_; ++t) total_[t] += returns_.back()[t];
  }
}

double StepCredit::return_from(std::size_t sample, std::size_t step) const {
  return returns_.at(sample)[std::min(step, steps_)];
}

double StepCredit::advantage(std::size_t sample, std::size_t step) const {
  if (step >= steps_) return 0.0;
  const double own = returns_.at(sample)[step];
  const double others = (total_[step] - own) / static_cast<double>(returns_.size() - 1);
  return own - others;
}

}  // namespace kvsim::train
