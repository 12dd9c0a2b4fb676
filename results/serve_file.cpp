#include "results/serve_file.h"

#include <fstream>
#include <sstream>

#include "core/csv.h"
#include "core/error.h"
#include "results/json_integer.h"
#include "results/schema.h"

namespace kvsim::results {

namespace {

const std::vector<std::string> kHitRateColumns = {
    "eviction", "capacity_blocks", "requests",       "block_refs", "hit_blocks",           "block_hit_rate",
    "tokens",   "hit_tokens",      "token_hit_rate", "evictions",  "reuse_ceiling_blocks", "reuse_ceiling_tokens"};
const std::vector<std::string> kSimulateColumns = {"eviction",
                                                   "hbm_gb",
                                                   "kv_policy",
                                                   "kv_config",
                                                   "kv_ratio",
                                                   "profile",
                                                   "instances",
                                                   "route",
                                                   "dram_gb",
                                                   "ssd_gb",
                                                   "transitions",
                                                   "transition_diff",
                                                   "max_batch_tokens",
                                                   "time_scale",
                                                   "requests",
                                                   "completed",
                                                   "rejected",
                                                   "hit_rate",
                                                   "hbm_share",
                                                   "dram_share",
                                                   "ssd_share",
                                                   "transition_share",
                                                   "recompute_share",
                                                   "loaded_dram_gb",
                                                   "loaded_ssd_gb",
                                                   "written_dram_gb",
                                                   "written_ssd_gb",
                                                   "ttft_p50_ms",
                                                   "ttft_p90_ms",
                                                   "ttft_p99_ms",
                                                   "ttft_mean_ms",
                                                   "tbt_p50_ms",
                                                   "tbt_p90_ms",
                                                   "tbt_p99_ms",
                                                   "queue_p50_ms",
                                                   "queue_p90_ms",
                                                   "queue_p99_ms",
                                                   "throughput_tokens_s",
                                                   "throughput_requests_s",
                                                   "makespan_s",
                                                   "prefill_tokens",
                                                   "output_tokens",
                                                   "planned_ms",
                                                   "recompute_only_ms",
                                                   "load_only_ms",
                                                   "est_kl",
                                                   "mean_kl",
                                                   "live_kl",
                                                   "top1",
                                                   "task_score",
                                                   "steps",
                                                   "evictions",
                                                   "seconds"};

std::string prefix(ServeKind kind) {
  return kind == ServeKind::HitRate ? "# kvsim serve hit-rate results" : "# kvsim serve simulate results";
}

std::string dump(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

// The kind whose columns the header names: a schema-1 file (no banner) is told by its columns.
ServeKind kind_of(const std::vector<std::string>& header, const std::string& path) {
  if (header == kHitRateColumns) return ServeKind::HitRate;
  if (header == kSimulateColumns) return ServeKind::Simulate;
  throw FormatError(path + ": columns " + csv_line(header).substr(0, 80) +
                    "...; expected those of kvsim serve hit-rate or serve simulate");
}

nlohmann::json parse_line(const std::string& line, const std::string& where, const char* expected) {
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw FormatError(where + ": not a JSON object; expected " + expected);
  return j;
}

}  // namespace

const std::vector<std::string>& serve_columns(ServeKind kind) {
  return kind == ServeKind::HitRate ? kHitRateColumns : kSimulateColumns;
}

std::string serve_csv_text(ServeKind kind, const nlohmann::json& summary) {
  const std::vector<std::string>& header = serve_columns(kind);
  std::string text = banner_with_schema(prefix(kind), kServeSchema) + ": one row per grid point\n";
  text += csv_line(header) + "\n";
  for (const nlohmann::json& row : summary.at("results")) {
    std::vector<std::string> cells;
    for (const std::string& key : header) {
      const nlohmann::json& v = row.contains(key) ? row[key] : summary.contains(key) ? summary[key] : nlohmann::json();
      cells.push_back(v.is_string() ? v.get<std::string>() : v.is_null() ? std::string() : v.dump());
    }
    text += csv_line(cells) + "\n";
  }
  return text;
}

std::string serve_json_text(const nlohmann::json& summary) {
  nlohmann::json j = summary;
  j["schema"] = kServeSchema;
  return j.dump(2) + "\n";
}

ServeTable read_serve_csv(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot open; expected a kvsim serve CSV");
  ServeTable t;
  std::string line;
  int n = 0, schema = 1;
  while (std::getline(in, line)) {
    ++n;
    if (line.rfind("# kvsim serve ", 0) == 0) {
      const std::string p =
          line.rfind(prefix(ServeKind::HitRate), 0) == 0 ? prefix(ServeKind::HitRate) : prefix(ServeKind::Simulate);
      schema = banner_schema(line, p, path);
      check_schema(schema, kServeSchema, path, "kvsim serve CSV");
    } else if (!line.empty() && line[0] != '#') {
      break;
    }
  }
  t.schema = schema;
  t.columns = parse_csv_line(line);
  t.kind = kind_of(t.columns, path + ":" + std::to_string(n));
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    t.rows.push_back(parse_csv_line(line));
    if (t.rows.back().size() != t.columns.size())
      throw FormatError(path + ":" + std::to_string(n) + ": " + std::to_string(t.rows.back().size()) +
                        " fields, expected " + std::to_string(t.columns.size()));
  }
  return t;
}

nlohmann::json read_serve_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot open; expected a kvsim serve JSON summary");
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    throw FormatError(path + ": not a JSON object; expected a kvsim serve summary");
  int schema = 1;
  if (j.contains("schema") && !as_integer(j["schema"], schema))
    throw FormatError(path + ": field 'schema' is " + dump(j["schema"]).substr(0, 40) + ", expected an integer");
  check_schema(schema, kServeSchema, path, "kvsim serve JSON summary");
  if (!j.contains("results") || !j["results"].is_array())
    throw FormatError(path + ": no list 'results'; expected a kvsim serve summary");
  for (const auto& r : j["results"])
    if (!r.is_object()) throw FormatError(path + ": 'results' holds " + dump(r).substr(0, 60) + ", expected objects");
  return j;
}

std::string grid_progress_head(const nlohmann::json& config) {
  return dump(nlohmann::json{{"schema", kServeSchema}, {"config", config}});
}

std::string grid_progress_line(std::size_t point, const nlohmann::json& row) {
  return dump(nlohmann::json{{"point", point}, {"row", row}});
}

GridProgress parse_grid_progress(const std::vector<std::string>& lines, const std::string& path) {
  GridProgress g;
  const nlohmann::json head = nlohmann::json::parse(lines.empty() ? std::string() : lines[0], nullptr, false);
  if (head.is_discarded() || !head.is_object() || !head.contains("config"))
    throw FormatError(path + ": line 1: expected a kvsim serve progress header {\"config\": ...}; not a progress file");
  int schema = 1;
  if (head.contains("schema") && !as_integer(head["schema"], schema))
    throw FormatError(path + ": line 1: field 'schema' is " + dump(head["schema"]).substr(0, 40) +
                      ", expected an integer");
  check_schema(schema, kServeSchema, path, "kvsim serve progress file");
  g.config = head["config"];
  for (std::size_t i = 1; i < lines.size(); ++i) {
    const std::string where = path + ": line " + std::to_string(i + 1);
    nlohmann::json j = parse_line(lines[i], where, "{\"point\": N, \"row\": {...}}");
    std::size_t point = 0;
    if (!j.contains("point") || !as_integer(j["point"], point) || !j.contains("row") || !j["row"].is_object())
      throw FormatError(where + ": expected {\"point\": N, \"row\": {...}}");
    g.rows.emplace_back(point, std::move(j["row"]));
  }
  return g;
}

}  // namespace kvsim::results
