#pragma once
// Reading a `kvsim sweep` result file back: the offline side of the agreement report, and the
// source of `kvsim verify --from-sweep` configs. Errors name the file, line and column.
#include <map>
#include <string>
#include <vector>

namespace kvsim {

struct OfflineRow {
  std::string trace, request, mode, policy, params;
  double budget = 0;
  std::map<std::string, double> metrics;  // offline metrics, larger = worse (see offline_metric_names)
  std::vector<double> layer_out_sq;       // per layer, from the detail file (what the estimator weighs)
  std::string semantics;                  // budget_semantics ("point", "peak/64"; empty in older files)
  int line = 0;
};

// The offline metrics the report ranks by, each oriented so that larger is worse: recall_loss
// (1 - mean recall), mean_kl, p95_kl, mean_out_err, p95_out_err, mean_out_sq (mean squared
// absolute output error), est_kl (the calibrated estimate, sim/estimator.h); with a detail file also the
// per-layer aggregates last_layer_kl, max_layer_kl, last_layer_err, max_layer_err.
std::vector<std::string> offline_metric_names(bool with_detail);

// Rows of a sweep CSV. Throws naming the file and the missing column, or the line that does not
// parse; policies are checked against the registry (an unknown one names its line).
std::vector<OfflineRow> read_sweep_csv(const std::string& path);

// Adds the per-layer aggregates from the sweep's JSON-lines detail file to matching rows.
void add_sweep_detail(std::vector<OfflineRow>& rows, const std::string& detail_path);

}  // namespace kvsim
