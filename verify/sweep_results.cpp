#include "verify/sweep_results.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "policies/registry.h"
#include "sim/csv.h"

namespace kvsim {

std::vector<std::string> offline_metric_names(bool with_detail) {
  std::vector<std::string> out = {"recall_loss", "mean_kl",     "p95_kl", "mean_out_err",
                                  "p95_out_err", "mean_out_sq", "est_kl"};
  if (with_detail)
    for (const char* m : {"last_layer_kl", "max_layer_kl", "last_layer_err", "max_layer_err"}) out.push_back(m);
  return out;
}

std::vector<OfflineRow> read_sweep_csv(const std::string& path) {
  CsvReader csv(path,
                {"trace", "request", "mode", "policy", "params", "budget", "mean_recall", "mean_kl", "p95_kl",
                 "mean_out_err", "p95_out_err"},
                "a kvsim sweep result file");
  std::vector<OfflineRow> rows;
  while (csv.next()) {
    OfflineRow r;
    r.line = csv.line();
    r.trace = csv.text("trace");
    r.request = csv.text("request");
    r.mode = csv.text("mode");
    r.policy = csv.text("policy");
    r.params = csv.text("params");
    r.budget = csv.number("budget");
    try {
      PolicyRegistry::instance().create(r.params.empty() ? r.policy : r.policy + ":" + r.params);
    } catch (const Error& e) {
      throw FormatError(csv.where() + ": " + e.what());
    }
    r.metrics["recall_loss"] = 1.0 - csv.number("mean_recall");
    for (const char* m : {"mean_kl", "p95_kl", "mean_out_err", "p95_out_err"}) r.metrics[m] = csv.number(m);
    // A column of newer sweeps. (Their est_kl column is not read: the estimate enters the
    // agreement only through --estimator, which also leaves its calibration requests out.)
    if (csv.has("mean_out_sq")) r.metrics["mean_out_sq"] = csv.number("mean_out_sq");
    if (csv.has("budget_semantics")) r.semantics = csv.text("budget_semantics");
    rows.push_back(std::move(r));
  }
  if (rows.empty()) throw FormatError(path + ": no result rows (expected a kvsim sweep result file)");
  return rows;
}

void add_sweep_detail(std::vector<OfflineRow>& rows, const std::string& detail_path) {
  std::ifstream in(detail_path);
  if (!in) throw Error(detail_path + ": cannot open the sweep detail file");
  std::map<std::tuple<std::string, std::string, std::string, double>, nlohmann::json> by_key;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw FormatError(detail_path + ":" + std::to_string(n) + ": not valid JSON (" + e.what() + ")");
    }
    if (!j.contains("request") || !j.contains("layer_kl")) continue;  // the config line
    if (!j.contains("policy") || !j.contains("budget") || !j.contains("layer_out_err"))
      throw FormatError(detail_path + ":" + std::to_string(n) + ": expected policy, budget, layer_kl, layer_out_err");
    by_key[{j["trace"].get<std::string>(), j["request"].get<std::string>(), j["policy"].get<std::string>(),
            j["budget"].get<double>()}] = j;
  }
  for (OfflineRow& r : rows) {
    const std::string label = r.params.empty() ? r.policy : r.policy + ":" + r.params;
    const auto it = by_key.find({r.trace, r.request, label, r.budget});
    if (it == by_key.end())
      throw FormatError(detail_path + ": no detail for " + label + " at budget " + std::to_string(r.budget) +
                        " of request '" + r.request + "' (the detail file of another sweep?)");
    if (it->second.contains("layer_out_sq")) r.layer_out_sq = it->second["layer_out_sq"].get<std::vector<double>>();
    const auto kl = it->second["layer_kl"].get<std::vector<double>>();
    const auto err = it->second["layer_out_err"].get<std::vector<double>>();
    if (kl.empty() || err.empty()) continue;
    r.metrics["last_layer_kl"] = kl.back();
    r.metrics["max_layer_kl"] = *std::max_element(kl.begin(), kl.end());
    r.metrics["last_layer_err"] = err.back();
    r.metrics["max_layer_err"] = *std::max_element(err.begin(), err.end());
  }
}

}  // namespace kvsim
