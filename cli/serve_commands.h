#pragma once
// What the `kvsim serve` subcommands share (serve_command.cpp, serve_simulate_command.cpp,
// kv_policy_rows.cpp).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands.h"

namespace kvsim::cli {

int serve_simulate(const Args& args);

// Comma-separated counts >= 1; errors name the flag.
std::vector<std::int64_t> parse_counts(const std::string& s, const std::string& flag, const std::string& what);
// Refuses each existing file of `files` unless --force.
void refuse_overwrite(const std::vector<std::string>& files, bool force);

// A KV compression config for the serving simulation, from sweep and verify result rows.
struct KvPolicyRow {
  std::string spec;   // as asked: "none", "snapkv@0.25", "kivi:bits=4@1"
  std::string label;  // the matched config: policy[:params]@budget
  double ratio = 1;   // its KV bytes / the full cache's, over the matched rows (bytes-weighted)
  std::int64_t rows = 0;
  // Fidelity beside it, NaN where no row gave it: the offline estimate of live KL and the
  // replay's own KL (sweep rows), live KL, top-1 agreement and task score (verify rows).
  double est_kl, mean_kl, live_kl, top1, task_score;
};
// `specs` split by ';'. "none" is the full cache. Any other spec is POLICY[:key=value,...]@BUDGET
// and must match exactly one config (policy, the given params, budget) across `files` (sweep or
// verify CSVs). Errors name the spec, the files and the configs it could mean.
std::vector<KvPolicyRow> read_kv_policies(const std::string& specs, const std::vector<std::string>& files);

}  // namespace kvsim::cli
