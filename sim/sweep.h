#pragma once
// `kvsim sweep`: every (policy, budget) config over every complete request of every trace, one
// pass per request. Rows go to a tidy CSV as each request finishes (flushed), so a killed sweep
// resumes where it stopped; per-layer detail goes to a JSON-lines file beside it.
#include <functional>
#include <iosfwd>
#include <utility>
#include <string>
#include <vector>

#include "results/sweep_file.h"
#include "sim/replay.h"

namespace kvsim {

struct SweepSpec {
  std::vector<std::string> traces;
  std::vector<std::string> policies;  // "name" or "name:key=value,..."
  std::vector<double> budgets;        // fractions of the full fp16 KV bytes, in (0, 1]
  ReplayMode mode = ReplayMode::QueryAware;
  std::int64_t compress_every = 0;  // > 0: the policy also cuts the cache every this many prompt tokens
  BudgetRule budget_rule;           // when the byte budget holds: at the compression point, or at every step
  std::string out_csv;
  std::string detail_jsonl;              // empty: no per-layer detail
  std::string estimator;                 // a `kvsim calibrate` file: fills the est_kl column (else empty)
  bool resume = false;                   // skip rows already in out_csv (same configuration only)
  bool force = false;                    // replace an existing out_csv
  bool progress = true;                  // progress line on stderr
  bool allow_training_requests = false;  // learned policies may be evaluated on their training prompts
  // --shard i/n: only the requests k (over all traces, in order) with k % n == i; the results file
  // records the shard, and `kvsim sweep merge` joins a complete set (sim/sweep_merge.h).
  int shard = 0, shards = 1;
  // Optional, for a shared work queue (MPI ranks): asked before each request this sweep has not
  // finished yet; false means another process takes it.
  std::function<bool(const std::string& trace, const std::string& request)> claim;
};

// "i/n" with 0 <= i < n; throws naming the expected form.
std::pair<int, int> parse_shard(const std::string& s);

// The configs a spec expands to: `full` once at budget 1.0, every other policy at every budget.
std::vector<ReplayConfig> expand_configs(const SweepSpec& spec);
// The resolved configuration echoed at the top of every result file (results/sweep_file.h); a
// shard's also names the whole sweep's request count (all_requests).
results::SweepConfig sweep_config(const SweepSpec& spec, const std::vector<ReplayConfig>& configs,
                                  std::int64_t all_requests = -1);

struct SweepSummaryRow {
  std::string label;
  double budget = 0, mean_recall = 0, mean_kl = 0, p95_kl = 0, mean_err = 0, kept_fraction = 0;
  int requests = 0;
};

// Runs the sweep; returns the per-(policy, budget) means over all requests in out_csv.
std::vector<SweepSummaryRow> run_sweep(const SweepSpec& spec, std::ostream& progress);

// Human-readable table, ranked by mean KL within each budget.
void print_summary(const std::vector<SweepSummaryRow>& rows, std::ostream& os);

// A result file's finished requests (every config's row; a torn tail dropped), in file order, each
// with its rows as written; throws when the file was written for another configuration.
using SweepRequestRows = std::vector<std::pair<std::pair<std::string, std::string>, std::vector<std::string>>>;
SweepRequestRows finished_sweep_rows(const std::string& path, const results::SweepConfig& config,
                                     std::size_t per_request);
// The same for a --detail file; a missing one has none.
SweepRequestRows finished_detail_rows(const std::string& path, const results::SweepConfig& config,
                                      std::size_t per_request);

// The per-(policy, budget) means over every row of a sweep result file.
std::vector<SweepSummaryRow> summarize_sweep_csv(const std::string& path);

}  // namespace kvsim
