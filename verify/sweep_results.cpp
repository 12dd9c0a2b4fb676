#include "verify/sweep_results.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "core/error.h"
#include "policies/registry.h"
#include "results/detail_file.h"

namespace kvsim {

std::vector<std::string> offline_metric_names(bool with_detail) {
  std::vector<std::string> out = {"recall_loss", "mean_kl",     "p95_kl", "mean_out_err",
                                  "p95_out_err", "mean_out_sq", "est_kl"};
  if (with_detail)
    for (const char* m : {"last_layer_kl", "max_layer_kl", "last_layer_err", "max_layer_err"}) out.push_back(m);
  return out;
}

std::vector<OfflineRow> read_sweep_csv(const std::string& path) {
  std::vector<OfflineRow> rows;
  for (const results::SweepRow& x : results::read_sweep_file(path).rows) {
    OfflineRow r;
    r.line = x.line;
    r.trace = x.trace, r.request = x.request, r.mode = x.mode, r.policy = x.policy, r.params = x.params;
    r.budget = x.budget;
    try {
      PolicyRegistry::instance().create(r.params.empty() ? r.policy : r.policy + ":" + r.params);
    } catch (const Error& e) {
      throw FormatError(path + ":" + std::to_string(x.line) + ": " + e.what());
    }
    r.metrics["recall_loss"] = 1.0 - x.mean_recall;
    r.metrics["mean_kl"] = x.mean_kl, r.metrics["p95_kl"] = x.p95_kl;
    r.metrics["mean_out_err"] = x.mean_out_err, r.metrics["p95_out_err"] = x.p95_out_err;
    // A column of newer sweeps (NaN when absent). The est_kl column is not read: the estimate
    // enters the agreement only through --estimator, which also leaves its calibration requests out.
    if (!std::isnan(x.mean_out_sq)) r.metrics["mean_out_sq"] = x.mean_out_sq;
    r.semantics = x.budget_semantics;
    rows.push_back(std::move(r));
  }
  if (rows.empty()) throw FormatError(path + ": no result rows (expected a kvsim sweep result file)");
  return rows;
}

void add_sweep_detail(std::vector<OfflineRow>& rows, const std::string& detail_path) {
  std::map<std::tuple<std::string, std::string, std::string, double>, results::DetailRow> by_key;
  for (results::DetailRow& d : results::read_detail_file(detail_path).rows)
    by_key[{d.trace, d.request, d.policy, d.budget}] = std::move(d);
  for (OfflineRow& r : rows) {
    const std::string label = r.params.empty() ? r.policy : r.policy + ":" + r.params;
    const auto it = by_key.find({r.trace, r.request, label, r.budget});
    if (it == by_key.end())
      throw FormatError(detail_path + ": no detail for " + label + " at budget " + std::to_string(r.budget) +
                        " of request '" + r.request + "' (the detail file of another sweep?)");
    r.layer_out_sq = it->second.layer_out_sq;
    const auto& kl = it->second.layer_kl;
    const auto& err = it->second.layer_out_err;
    if (kl.empty() || err.empty()) continue;
    r.metrics["last_layer_kl"] = kl.back();
    r.metrics["max_layer_kl"] = *std::max_element(kl.begin(), kl.end());
    r.metrics["last_layer_err"] = err.back();
    r.metrics["max_layer_err"] = *std::max_element(err.begin(), err.end());
  }
}

}  // namespace kvsim
