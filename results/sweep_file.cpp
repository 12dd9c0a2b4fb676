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
#include "results/json_integer.h"
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

std::string dump(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

// A field of the configuration, type-checked; `fallback` when absent.
template <class T>
T field(const nlohmann::json& j, const char* key, T fallback, const std::string& path) {
  if (!j.contains(key)) return fallback;
  const nlohmann::json& v = j.at(key);
  T out{};
  if (json_value(v, out)) return out;
  const char* want = std::is_same_v<T, std::string>                ? "a string"
                     : std::is_integral_v<T>                       ? "an integer"
                     : std::is_same_v<T, std::vector<std::string>> ? "a list of strings"
                                                                   : "a list of numbers";
  throw FormatError(path + ": config field '" + key + "' is " + dump(v).substr(0, 80) + ", expected " + want);
}

std::uint64_t hash_value(const std::string& text, const std::string& where) {
  char* end = nullptr;
  const unsigned long long x = std::strtoull(text.c_str(), &end, 10);
  if (text.empty() || text[0] == '-' || end != text.c_str() + text.size())
    throw FormatError(where + ": column 'keep_hash' is '" + text + "', expected an unsigned integer");
  return x;
}

// The current record of `csv` as a row; columns newer than schema 1 read as NaN or empty when
// the file has none.
SweepRow parse_row(const CsvReader& csv) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  SweepRow r;
  r.trace = csv.text_or("trace"), r.request = csv.text_or("request"), r.mode = csv.text_or("mode");
  r.policy = csv.text_or("policy"), r.params = csv.text_or("params");
  r.budget = csv.number_or("budget", nan), r.budget_tokens = csv.integer_or("budget_tokens", 0);
  r.kept_fraction = csv.number_or("kept_fraction", nan), r.mean_recall = csv.number_or("mean_recall", nan);
  r.mean_kl = csv.number_or("mean_kl", nan), r.p95_kl = csv.number_or("p95_kl", nan),
  r.mean_out_err = csv.number_or("mean_out_err", nan);
  r.p95_out_err = csv.number_or("p95_out_err", nan), r.compressed_bytes = csv.number_or("compressed_bytes", nan);
  r.budget_bytes = csv.number_or("budget_bytes", nan), r.peak_bytes = csv.number_or("peak_bytes", nan),
  r.final_bytes = csv.number_or("final_bytes", nan);
  r.footprint_byte_steps = csv.number_or("footprint_byte_steps", nan), r.host_bytes = csv.number_or("host_bytes", nan);
  r.eval_queries = csv.integer_or("eval_queries", 0), r.rows = csv.integer_or("rows", 0);
  r.keep_hash = csv.has("keep_hash") ? hash_value(csv.text("keep_hash"), csv.where()) : 0;
  r.position_fallback = csv.number_or("position_fallback", nan), r.budget_semantics = csv.text_or("budget_semantics");
  r.decode_peak_bytes = csv.number_or("decode_peak_bytes", nan), r.mean_out_sq = csv.number_or("mean_out_sq", nan);
  if (!csv.text_or("est_kl").empty()) r.est_kl = csv.number("est_kl");
  r.line = csv.line();
  return r;
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
  std::string text;
  bool head = true;  // the comment lines before the column names
  for (std::size_t n = 0; n < lines.size(); ++n) {
    head = head && (lines[n].empty() || lines[n][0] == '#');
    if (head && lines[n] == kBanner) f.has_banner = true;
    if (head && is_config_line(lines[n])) {
      f.config_text = config_json(lines[n]);
      f.config = parse_sweep_config(f.config_text, path + ":" + std::to_string(n + 1));
    }
    text += lines[n] + "\n";
  }
  // Only whole lines reach the reader: a line a kill cut is never half-read.
  CsvReader csv(std::make_unique<std::istringstream>(text), path,
                std::vector<std::string>(kRequired.begin(), kRequired.end()), std::string("a ") + kKind);
  for (const std::string& name : csv.columns())
    if (!std::count(kColumns.begin(), kColumns.end(), name))
      throw FormatError(path + ": unknown column '" + name + "'; expected a " + kKind);
  while (csv.next()) {
    f.rows.push_back(parse_row(csv));
    f.lines.push_back(csv.record());
  }
  return f;
}

std::optional<SweepConfig> read_sweep_config(const std::string& path) {
  const std::vector<std::string> head = head_lines(path);
  for (std::size_t n = 0; n < head.size(); ++n)
    if (is_config_line(head[n])) return parse_sweep_config(config_json(head[n]), path + ":" + std::to_string(n + 1));
  return std::nullopt;
}

}  // namespace kvsim::results
