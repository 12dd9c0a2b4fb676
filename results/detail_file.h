#pragma once
// The owner of the `kvsim sweep --detail` file (docs/result-files.md): JSON Lines, the sweep's
// configuration first (the same JSON as the result file's configuration line, whose "schema"
// numbers both), then one object per trace x request x config with per-layer measures.
#include <string>
#include <vector>

#include "results/sweep_file.h"

namespace kvsim::results {

struct DetailRow {
  std::string trace, request, policy;  // policy: the config's label ("name:k=v")
  double budget = 0;
  std::vector<double> layer_recall, layer_kl, layer_out_err, layer_out_sq, layer_p95_kl, layer_p95_out_err;
  std::vector<std::vector<double>> head_kl;  // [layer][query head]
  int line = 0;
};

// One row as the file holds it (no newline).
std::string detail_row_line(const DetailRow& r);
// The first line: the configuration (newline-terminated).
std::string detail_file_head(const SweepConfig& c);

struct DetailFile {
  std::string path;
  SweepConfig config;
  std::string config_text;  // the first line, as written
  std::vector<DetailRow> rows;
  std::vector<std::string> lines;  // rows[i] exactly as written
};

// Reads and checks a detail file (schema, fields and their types); errors name the file and line.
DetailFile read_detail_file(const std::string& path, TornTail tail = TornTail::Refuse);

}  // namespace kvsim::results
