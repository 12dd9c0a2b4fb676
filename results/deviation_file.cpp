#include "results/deviation_file.h"

#include "core/csv.h"
#include "core/error.h"
#include "results/schema.h"

namespace kvsim::results {

namespace {

const char* const kPrefix = "# kvsim chunk deviation";
const char* const kKind = "kvsim chunk deviation file";

std::string threshold_column(double x) {
  std::string s = csv_number(x);
  return "above_" + s;
}

std::vector<std::string> columns() {
  std::vector<std::string> c = {"comparison", "layer", "tokens", "p50", "p90", "p99"};
  for (const double x : kDeviationThresholds) c.push_back(threshold_column(x));
  return c;
}

}  // namespace

std::string deviation_file_text(const DeviationFile& f) {
  std::string out = banner_with_schema(kPrefix, f.schema) + ": " + f.trace + "\n" + csv_line(columns()) + "\n";
  for (const DeviationRow& r : f.rows) {
    if (r.above.size() != kDeviationThresholds.size())
      throw Error("chunk deviation row: " + std::to_string(r.above.size()) + " shares, expected " +
                  std::to_string(kDeviationThresholds.size()));
    std::vector<std::string> cells = {r.comparison,      std::to_string(r.layer), std::to_string(r.tokens),
                                      csv_number(r.p50), csv_number(r.p90),       csv_number(r.p99)};
    for (const double a : r.above) cells.push_back(csv_number(a));
    out += csv_line(cells) + "\n";
  }
  return out;
}

DeviationFile read_deviation_file(const std::string& path) {
  DeviationFile f;
  const Banner banner = read_banner(path, kPrefix, kKind, kDeviationSchema);
  f.schema = banner.schema;
  f.trace = banner.rest;
  const std::vector<std::string> cols = columns();
  CsvReader csv(path, cols, std::string("a ") + kKind);
  while (csv.next()) {
    DeviationRow r;
    r.comparison = csv.text("comparison");
    if (r.comparison != "alone" && r.comparison != "other_path")
      throw FormatError(path + ": column 'comparison' is '" + r.comparison + "', expected alone or other_path");
    r.layer = static_cast<int>(csv.integer("layer"));
    r.tokens = static_cast<long long>(csv.integer("tokens"));
    r.p50 = csv.number("p50"), r.p90 = csv.number("p90"), r.p99 = csv.number("p99");
    for (std::size_t i = 6; i < cols.size(); ++i) r.above.push_back(csv.number(cols[i]));
    f.rows.push_back(std::move(r));
  }
  return f;
}

}  // namespace kvsim::results
