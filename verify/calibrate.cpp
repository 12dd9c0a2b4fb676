#include "verify/calibrate.h"

#include <map>
#include <set>
#include <tuple>

#include "core/error.h"

namespace kvsim {

namespace {

using Key = std::tuple<std::string, std::string, std::string, double>;  // request, policy, params, budget

void require_layers(const OfflineRow& r, const std::string& where) {
  if (r.layer_out_sq.empty())
    throw Error(where + ": no layer_out_sq for " + r.policy + " at budget " + std::to_string(r.budget) +
                " of request '" + r.request +
                "' (give the sweep's --detail file; a sweep from an older kvsim has to be rerun)");
}

}  // namespace

void require_same_semantics(const std::string& offline, const std::string& live, const std::string& where) {
  if (!offline.empty() && !live.empty() && offline != live)
    throw Error(where + ": the sweep held its budgets as " + offline + ", the live runs as " + live +
                " (budget_semantics); compare runs of one budget semantics");
}

Estimator calibrate_estimator(const std::vector<OfflineRow>& offline, const LiveResults& live, double smoothness,
                              const std::string& where) {
  std::map<Key, const OfflineRow*> off;
  for (const auto& r : offline) {
    if (r.mode != live.mode)
      throw Error(where + ": the sweep ran " + r.mode + ", the live runs " + live.mode +
                  "; calibrate one mode at a time");
    require_same_semantics(r.semantics, live.semantics, where);
    if (!off.emplace(Key{r.request, r.policy, r.params, r.budget}, &r).second)
      throw Error(where + ": request '" + r.request + "' has two rows for " + r.policy + " at budget " +
                  std::to_string(r.budget) +
                  " (several traces with the same request ids?); calibrate on one sweep of distinct requests");
  }
  std::vector<std::vector<double>> features;
  std::vector<double> targets;
  std::set<std::string> requests;
  std::map<std::tuple<std::string, std::string, double>, std::vector<std::size_t>> by_config;  // its rows
  for (const LiveRow& l : live.rows) {
    if (!(l.budget < 1.0)) continue;
    const auto it = off.find({l.request, l.policy, l.params, l.budget});
    if (it == off.end()) continue;
    require_layers(*it->second, where);
    features.push_back(it->second->layer_out_sq);
    targets.push_back(l.live_kl);
    requests.insert(l.request);
    by_config[{l.policy, l.params, l.budget}].push_back(features.size() - 1);
  }
  if (by_config.size() < 3)
    throw Error(where + ": " + std::to_string(by_config.size()) +
                " compressed configs were run both offline and live on the same requests; calibration needs at least 3 "
                "(same request ids, policy parameters and budgets on both sides)");
  Estimator e;
  e.weights = fit_layer_weights(features, targets, smoothness);
  e.smoothness = smoothness;
  e.mode = live.mode;
  e.requests.assign(requests.begin(), requests.end());
  e.configs = static_cast<int>(by_config.size());
  e.rows = static_cast<int>(features.size());
  std::vector<double> est, kl;  // per config, means over its requests
  for (const auto& [key, rows] : by_config) {
    double sum_est = 0, sum_kl = 0;
    for (std::size_t i : rows) {
      sum_est += e.predict(features[i], where);
      sum_kl += targets[i];
    }
    est.push_back(sum_est / static_cast<double>(rows.size()));
    kl.push_back(sum_kl / static_cast<double>(rows.size()));
  }
  e.fit_spearman = spearman(est, kl);
  return e;
}

std::vector<std::string> apply_estimator_file(std::vector<OfflineRow>& rows, const std::string& estimator,
                                              const std::string& detail) {
  if (estimator.empty()) return {};
  if (detail.empty()) throw Error("--estimator needs the sweep's --detail file (its per-layer errors)");
  const Estimator e = read_estimator(estimator);
  apply_estimator(rows, e, detail);
  return e.requests;
}

void apply_estimator(std::vector<OfflineRow>& rows, const Estimator& e, const std::string& where) {
  for (OfflineRow& r : rows) {
    if (r.mode != e.mode)
      throw Error(where + ": the estimator was calibrated on " + e.mode + " runs, but the sweep ran " + r.mode);
    require_layers(r, where);
    r.metrics["est_kl"] = e.predict(r.layer_out_sq, where);
  }
}

}  // namespace kvsim
