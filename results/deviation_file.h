#pragma once
// The owner of the chunk-deviation file (`kvsim trace deviation -o`; docs/chunk-states.md): a
// banner with the schema and the trace, the column names, then one row per comparison and layer:
// how many chunk tokens were compared and the distribution of their relative KV deviation.
#include <string>
#include <vector>

namespace kvsim::results {

inline constexpr int kDeviationSchema = 1;
// The deviations whose exceeding shares each row gives (columns above_<x>).
inline const std::vector<double> kDeviationThresholds = {0.05, 0.1, 0.2, 0.5};

struct DeviationRow {
  std::string comparison;  // "alone" | "other_path"
  int layer = 0;
  long long tokens = 0;
  double p50 = 0, p90 = 0, p99 = 0;
  std::vector<double> above;  // per kDeviationThresholds
};

struct DeviationFile {
  int schema = kDeviationSchema;
  std::string trace;
  std::vector<DeviationRow> rows;
};

std::string deviation_file_text(const DeviationFile& f);
// Reads and checks one; errors name the file, line and column.
DeviationFile read_deviation_file(const std::string& path);

}  // namespace kvsim::results
