#pragma once
// The owner of the `kvsim sweep` result file (docs/result-files.md): a banner, the configuration
// line (a "# config:" tag and JSON, whose "schema" numbers the file), the column names, then one row per
// trace x request x config, appended and flushed a request at a time. Nothing else spells its
// banner, configuration tag or columns; everything that writes or reads one comes here.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kvsim::results {

inline constexpr int kSweepSchema = 2;

// What the configuration line records: the resolved sweep (echoed so --resume and merge can tell
// whether two files come from the same sweep).
struct SweepConfig {
  int schema = kSweepSchema;
  std::string tool;
  std::vector<std::string> traces;
  std::string mode;
  std::int64_t compress_every = 0;  // schema 1 files may spell it prefill_chunk
  std::string budget_semantics = "point";
  std::string estimator;  // empty: none
  std::vector<double> budgets;
  std::string shard;                                    // "i/n" for a shard's file, else empty
  std::int64_t shard_of_requests = -1;                  // the whole sweep's request count (shards only)
  std::vector<std::pair<std::string, double>> configs;  // (policy label, budget), in row order
};

// The configuration as one line of JSON (without its tag), and back; `where` names
// the file (and line) in errors.
std::string sweep_config_text(const SweepConfig& c);
SweepConfig parse_sweep_config(const std::string& text, const std::string& where);

struct SweepRow {
  std::string trace, request, mode, policy, params;
  double budget = 0;
  std::int64_t budget_tokens = 0;
  double kept_fraction = 0, mean_recall = 0, mean_kl = 0, p95_kl = 0, mean_out_err = 0, p95_out_err = 0;
  double compressed_bytes = 0, budget_bytes = 0, peak_bytes = 0, final_bytes = 0, footprint_byte_steps = 0;
  double host_bytes = 0;
  std::int64_t eval_queries = 0, rows = 0;
  std::uint64_t keep_hash = 0;
  double position_fallback = 0;
  std::string budget_semantics;                   // empty in schema 1 files that predate the column
  double decode_peak_bytes = 0, mean_out_sq = 0;  // NaN where an older file has no such column
  std::optional<double> est_kl;                   // empty: the sweep had no --estimator
  int line = 0;                                   // in the file it was read from
};

// One row as the file holds it (no newline).
std::string sweep_row_line(const SweepRow& r);
// The banner, configuration line and column names, each newline-terminated.
std::string sweep_file_head(const SweepConfig& c);
const std::vector<std::string>& sweep_columns();

// A file's last line cut by a kill: refused (readers of results), or left out (--resume, which
// redoes that request).
enum class TornTail { Refuse, Drop };

struct SweepFile {
  std::string path;
  bool has_banner = false;
  std::optional<SweepConfig> config;  // absent when the file has no configuration line
  std::string config_text;            // that line's JSON, as written
  std::vector<SweepRow> rows;
  std::vector<std::string> lines;  // rows[i] exactly as written
};

// Reads and checks a sweep result file: schema, columns (those newer than schema 1 may be
// missing), every number a number. Errors name the file, line and column.
SweepFile read_sweep_file(const std::string& path, TornTail tail = TornTail::Refuse);
// Only its configuration (the lines before the column names).
std::optional<SweepConfig> read_sweep_config(const std::string& path);

}  // namespace kvsim::results
