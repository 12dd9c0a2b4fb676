#pragma once
// The owner of the `kvsim verify` result file (docs/result-files.md): a banner, the run's
// configuration line (a "# config:" tag and JSON, whose "schema" numbers the file), the column names,
// then one row per request x config. Records may span lines (the generated text is quoted).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvsim::results {

inline constexpr int kVerifySchema = 2;

struct VerifyConfig {
  int schema = kVerifySchema;
  std::string tool = "kvsim verify", model, tasks, mode, weights, queries, device, policy_steps;
  std::int64_t max_new = 0, min_new = 0, prefill_chunk = 0, compress_every = 0;
  std::string budget_semantics = "point";
};

struct VerifyRow {
  std::string request, task, mode, policy, params;
  double budget = 0;
  std::int64_t budget_tokens = 0;
  double kept_fraction = 0, compressed_bytes = 0, budget_bytes = 0;
  std::int64_t steps = 0;
  double live_kl = 0, max_kl = 0, top1 = 0, ppl = 0, reference_ppl = 0, task_score = 0, reference_task_score = 0;
  bool same_tokens = false;
  double seconds = 0;
  std::string policy_steps;
  double position_fallback = 0;
  std::string budget_semantics;  // empty in files that predate the column
  double decode_peak_bytes = 0;
  std::string generated;
  int line = 0;
};

std::string verify_file_head(const VerifyConfig& c);  // banner, configuration, column names
std::string verify_row_line(const VerifyRow& r);      // one row (no newline)

struct VerifyFile {
  std::string path;
  std::optional<VerifyConfig> config;  // absent when the file has no configuration line
  std::vector<VerifyRow> rows;
};

// Whether a CSV's column names are a verify file's (it has live_kl), not a sweep's.
bool is_verify_file(const std::string& path);
// Reads and checks a verify result file; columns newer than schema 1 may be missing (NaN /
// empty). Errors name the file, line and column.
VerifyFile read_verify_file(const std::string& path);

}  // namespace kvsim::results
