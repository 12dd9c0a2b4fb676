#pragma once
// `kvsim verify`: live runs of (policy, budget) configs over a task file, a CSV row per request
// and config, a summary table, and (given a sweep's results) the agreement report.
#include <iosfwd>
#include <string>
#include <vector>

#include "verify/live_verifier.h"

namespace kvsim {

struct VerifySpec {
  std::string model_path, tasks_path;
  std::vector<std::string> policies;  // with budgets: the configs to run
  std::vector<double> budgets;
  std::vector<ReuseConfig> reuse;  // chunk-reuse ways, run after the configs (docs/chunk-states.md)
  std::string from_sweep;          // or: the top configs of a sweep's results (by offline mean KL)
  int top = 8;
  std::string offline_csv;            // sweep results to compare with (from_sweep implies it)
  std::string offline_detail;         // that sweep's per-layer detail (optional)
  std::string estimator;              // a `kvsim calibrate` file: est_kl from the detail, its requests left out
  bool mode_given = false;            // --mode given explicitly (must then match the sweep's)
  bool compress_every_given = false;  // --compress-every given explicitly (the same)
  bool budget_rule_given = false;     // --budget-semantics / --reapply-every given explicitly (the same)
  VerifyOptions live;
  std::string out_csv = "verify.csv", agreement_csv;
  bool force = false, progress = true;
};

// Runs the spec; prints the summary (and agreement) to `out`. Returns the live seconds spent.
double run_verify(const VerifySpec& spec, std::ostream& out, std::ostream& progress);

}  // namespace kvsim
