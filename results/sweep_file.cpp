#include "results/sweep_file.h"

#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <type_traits>
#include <algorithm>

#include "core/csv.h"
#include "core/error.h"
#include "core/text_lines.h"
#include "results/schema.h"

namespace kvsim::results {

namespace {

const char* const kBanner = "# kvsim sweep results: one row per trace x request x policy x budget";
const char* const kKind = "kvsim sweep result file";

const std::vector<std::string> kColumns = {"trace",
                                           "request",
                                           "mode",
                                           "policy",
                                           "params",
                                           "budget",
                                           "budget_tokens",
                                           "kept_fraction",
                                           "mean_recall",
                                           "mean_kl",
                                           "p95_kl",
                                           "mean_out_err",
                                           "p95_out_err",
                                           "compressed_bytes",
                                           "budget_bytes",
                                           "peak_bytes",
                                           "final_bytes",
                                           "footprint_byte_steps",
                                           "host_bytes",
                                           "eval_queries",
                                           "rows",
                                           "keep_hash",
                                           "position_fallback",
                                           "budget_semantics",
                                           "decode_peak_bytes",
                                           "mean_out_sq",
                                           "est_kl"};
// The columns every schema-1 file has; the rest came later and read as NaN / empty when absent.
const std::set<std::string> kRequired = {"trace",       "request", "mode",   "policy",       "params",     "budget",
                                         "mean_recall", "mean_kl", "p95_kl", "mean_out_err", "p95_out_err"};
const std::set<std::string> kText = {"trace", "request", "mode", "policy", "params", "budget_semantics", "est_kl"};

std::string dump(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

// A field of the configuration, type-checked; `fallback` when absent.
template <class T>
T field(const nlohmann::json& j, const char* key, T fallback, const std::string& path) {
  if (!j.contains(key)) return fallback;
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    const char* want = std::is_same_v<T, std::string>                ? "a string"
                       : std::is_integral_v<T>                       ? "an integer"
                       : std::is_same_v<T, std::vector<std::string>> ? "a list of strings"
                                                                     : "a list of numbers";
    throw FormatError(path + ": config field '" + key + "' is " + dump(j.at(key)) + ", expected " + want);
  }
}

double number(const std::string& text, const std::string& column, const std::string& where) {
  char* end = nullptr;
  const double x = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size())
    throw FormatError(where + ": column '" + column + "' is '" + text + "', expected a number");
  return x;
}

std::int64_t integer(const std::string& text, const std::string& column, const std::string& where) {
  const double x = number(text, column, where);
  if (!(std::abs(x) < 9.2e18) || x != std::floor(x))
    throw FormatError(where + ": column '" + column + "' is '" + text + "', expected an integer");
  return static_cast<std::int64_t>(x);
}

std::uint64_t hash_value(const std::string& text, const std::string& where) {
  char* end = nullptr;
  const unsigned long long x = std::strtoull(text.c_str(), &end, 10);
  if (text.empty() || text[0] == '-' || end != text.c_str() + text.size())
    throw FormatError(where + ": column 'keep_hash' is '" + text + "', expected an unsigned integer");
  return x;
}

// One row from its fields, by the file's own column order.
SweepRow parse_row(const std::vector<std::string>& f, const std::map<std::string, std::size_t>& col,
                   const std::string& where) {
  if (f.size() != col.size())
    throw FormatError(where + ": " + std::to_string(f.size()) + " fields, expected " + std::to_string(col.size()) +
                      " (not a " + kKind + " row)");
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto text = [&](const char* c) { return col.count(c) ? f[col.at(c)] : std::string(); };
  auto num_or = [&](const char* c, double fallback) {
    return col.count(c) ? number(f[col.at(c)], c, where) : fallback;
  };
  SweepRow r;
  r.trace = text("trace"), r.request = text("request"), r.mode = text("mode");
  r.policy = text("policy"), r.params = text("params");
  r.budget = num_or("budget", nan);
  r.budget_tokens = col.count("budget_tokens") ? integer(text("budget_tokens"), "budget_tokens", where) : 0;
  r.kept_fraction = num_or("kept_fraction", nan), r.mean_recall = num_or("mean_recall", nan);
  r.mean_kl = num_or("mean_kl", nan), r.p95_kl = num_or("p95_kl", nan);
  r.mean_out_err = num_or("mean_out_err", nan), r.p95_out_err = num_or("p95_out_err", nan);
  r.compressed_bytes = num_or("compressed_bytes", nan), r.budget_bytes = num_or("budget_bytes", nan);
  r.peak_bytes = num_or("peak_bytes", nan), r.final_bytes = num_or("final_bytes", nan);
  r.footprint_byte_steps = num_or("footprint_byte_steps", nan), r.host_bytes = num_or("host_bytes", nan);
  r.eval_queries = col.count("eval_queries") ? integer(text("eval_queries"), "eval_queries", where) : 0;
  r.rows = col.count("rows") ? integer(text("rows"), "rows", where) : 0;
  r.keep_hash = col.count("keep_hash") ? hash_value(text("keep_hash"), where) : 0;
  r.position_fallback = num_or("position_fallback", nan);
  r.budget_semantics = text("budget_semantics");
  r.decode_peak_bytes = num_or("decode_peak_bytes", nan), r.mean_out_sq = num_or("mean_out_sq", nan);
  if (!text("est_kl").empty()) r.est_kl = number(text("est_kl"), "est_kl", where);
  return r;
}

std::map<std::string, std::size_t> column_index(const std::string& header, const std::string& where) {
  const std::vector<std::string> names = parse_csv_line(header);
  std::map<std::string, std::size_t> col;
  for (std::size_t i = 0; i < names.size(); ++i)
    if (!col.emplace(names[i], i).second)
      throw FormatError(where + ": column '" + names[i] + "' appears twice; expected a " + kKind);
  for (const auto& c : kRequired)
    if (!col.count(c)) throw FormatError(where + ": header has no column '" + c + "'; expected a " + kKind);
  for (const auto& [name, i] : col)
    if (!std::count(kColumns.begin(), kColumns.end(), name))
      throw FormatError(where + ": unknown column '" + name + "'; expected a " + kKind);
  return col;
}

}  // namespace

const std::vector<std::string>& sweep_columns() { return kColumns; }

SweepConfig parse_sweep_config(const std::string& text, const std::string& path) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    throw FormatError(path + ": its '# config:' line is not a JSON object; expected a " + kKind);
  SweepConfig c;
  c.schema = field<int>(j, "schema", 1, path);
  check_schema(c.schema, kSweepSchema, path, kKind);
  c.tool = field<std::string>(j, "tool", "", path);
  c.traces = field<std::vector<std::string>>(j, "traces", {}, path);
  c.mode = field<std::string>(j, "mode", "", path);
  // Schema 1 files written before the flag was renamed call the same schedule prefill_chunk.
  c.compress_every = field<std::int64_t>(j, "compress_every", field<std::int64_t>(j, "prefill_chunk", 0, path), path);
  if (c.compress_every < 0)
    throw FormatError(path + ": config field 'compress_every' is " + std::to_string(c.compress_every) +
                      ", expected an integer >= 0");
  if (j.contains("budget_semantics") && !j["budget_semantics"].is_string())
    throw FormatError(path + ": config field 'budget_semantics' is " + dump(j["budget_semantics"]) +
                      ", expected \"point\" or \"peak/N\"");
  c.budget_semantics = field<std::string>(j, "budget_semantics", "point", path);
  c.estimator = field<std::string>(j, "estimator", "", path);
  c.budgets = field<std::vector<double>>(j, "budgets", {}, path);
  c.shard = field<std::string>(j, "shard", "", path);
  c.shard_of_requests = field<std::int64_t>(j, "shard_of_requests", -1, path);
  if (j.contains("configs")) {
    if (!j["configs"].is_array()) throw FormatError(path + ": config field 'configs' is not a list");
    for (const auto& x : j["configs"]) {
      if (!x.is_object() || !x.contains("policy") || !x["policy"].is_string() || !x.contains("budget") ||
          !x["budget"].is_number())
        throw FormatError(path + ": config field 'configs' holds " + dump(x) + ", expected {\"policy\", \"budget\"}");
      c.configs.emplace_back(x["policy"].get<std::string>(), x["budget"].get<double>());
    }
  }
  return c;
}

std::string sweep_config_text(const SweepConfig& c) {
  nlohmann::json j;
  j["schema"] = c.schema;
  j["tool"] = c.tool;
  j["traces"] = c.traces;
  j["mode"] = c.mode;
  j["compress_every"] = c.compress_every;
  j["budget_semantics"] = c.budget_semantics;
  if (!c.estimator.empty()) j["estimator"] = c.estimator;
  j["budgets"] = c.budgets;
  if (!c.shard.empty()) {
    j["shard"] = c.shard;
    j["shard_of_requests"] = c.shard_of_requests;
  }
  nlohmann::json cfgs = nlohmann::json::array();
  for (const auto& [policy, budget] : c.configs) cfgs.push_back({{"policy", policy}, {"budget", budget}});
  j["configs"] = cfgs;
  return dump(j);
}

std::string sweep_row_line(const SweepRow& r) {
  return csv_line({r.trace,
                   r.request,
                   r.mode,
                   r.policy,
                   r.params,
                   csv_number(r.budget),
                   std::to_string(r.budget_tokens),
                   csv_number(r.kept_fraction),
                   csv_number(r.mean_recall),
                   csv_number(r.mean_kl),
                   csv_number(r.p95_kl),
                   csv_number(r.mean_out_err),
                   csv_number(r.p95_out_err),
                   csv_number(r.compressed_bytes),
                   csv_number(r.budget_bytes),
                   csv_number(r.peak_bytes),
                   csv_number(r.final_bytes),
                   csv_number(r.footprint_byte_steps),
                   csv_number(r.host_bytes),
                   std::to_string(r.eval_queries),
                   std::to_string(r.rows),
                   std::to_string(r.keep_hash),
                   csv_number(r.position_fallback),
                   r.budget_semantics,
                   csv_number(r.decode_peak_bytes),
                   csv_number(r.mean_out_sq),
                   r.est_kl ? csv_number(*r.est_kl) : std::string()});
}

std::string sweep_file_head(const SweepConfig& c) {
  return std::string(kBanner) + "\n" + config_line(sweep_config_text(c)) + "\n" + csv_line(kColumns) + "\n";
}

SweepFile read_sweep_file(const std::string& path, TornTail tail) {
  const std::vector<std::string> lines =
      tail == TornTail::Drop
          ? whole_lines(path)
          : complete_lines(path,
                           "its last line is cut short (the sweep was stopped while writing); finish it with "
                           "kvsim sweep ... --resume");
  SweepFile f;
  f.path = path;
  std::size_t n = 0;
  for (; n < lines.size() && (lines[n].empty() || lines[n][0] == '#'); ++n) {
    if (lines[n] == kBanner) f.has_banner = true;
    if (is_config_line(lines[n])) {
      f.config_text = config_json(lines[n]);
      f.config = parse_sweep_config(f.config_text, path + ":" + std::to_string(n + 1));
    }
  }
  if (n == lines.size()) throw FormatError(path + ": no column names; expected a " + std::string(kKind));
  const auto col = column_index(lines[n], path + ":" + std::to_string(n + 1));
  for (++n; n < lines.size(); ++n) {
    if (lines[n].empty() || lines[n][0] == '#') continue;
    SweepRow r = parse_row(parse_csv_line(lines[n]), col, path + ":" + std::to_string(n + 1));
    r.line = static_cast<int>(n + 1);
    f.rows.push_back(std::move(r));
    f.lines.push_back(lines[n]);
  }
  return f;
}

std::optional<SweepConfig> read_sweep_config(const std::string& path) {
  for (const std::string& line : whole_lines(path)) {
    if (line.empty() || line[0] != '#') break;
    if (is_config_line(line)) return parse_sweep_config(config_json(line), path);
  }
  return std::nullopt;
}

}  // namespace kvsim::results
