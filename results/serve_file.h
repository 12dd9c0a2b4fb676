#pragma once
// The owner of the serving outputs (docs/result-files.md): the CSV and JSON summaries of
// `kvsim serve hit-rate` and `kvsim serve simulate`, and the progress file their grids append to
// (OUT.progress: a header with the run's configuration, then one line per finished point).
// Rows are JSON objects as the simulator's result rows hold them; this module owns the files'
// banners, column lists, schema numbers and line formats.
#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace kvsim::results {

inline constexpr int kServeSchema = 2;

enum class ServeKind { HitRate, Simulate };

// The CSV's columns, in order (a row's value, else the summary's of the same name).
const std::vector<std::string>& serve_columns(ServeKind kind);

// Banner (with the schema), column names, one row per summary["results"] entry.
std::string serve_csv_text(ServeKind kind, const nlohmann::json& summary);
// The summary with its schema number, pretty-printed.
std::string serve_json_text(const nlohmann::json& summary);

struct ServeTable {
  ServeKind kind = ServeKind::Simulate;
  int schema = kServeSchema;
  std::vector<std::string> columns;
  std::vector<std::vector<std::string>> rows;
};
// Errors name the file, line and what was expected. Schema 1 files have no banner.
ServeTable read_serve_csv(const std::string& path);
// The summary, its schema checked and its results a list of objects.
nlohmann::json read_serve_json(const std::string& path);

// The progress file: its header line and a point's line (no newline), and what its whole lines
// hold: the configuration and each (point, row), in file order. Line errors name the file and line.
std::string grid_progress_head(const nlohmann::json& config);
std::string grid_progress_line(std::size_t point, const nlohmann::json& row);
struct GridProgress {
  nlohmann::json config;
  std::vector<std::pair<std::size_t, nlohmann::json>> rows;
};
GridProgress parse_grid_progress(const std::vector<std::string>& lines, const std::string& path);

}  // namespace kvsim::results
