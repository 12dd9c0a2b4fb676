#include "results/verify_file.h"

#include <algorithm>
#include <iomanip>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/csv.h"
#include "core/error.h"
#include "core/text_lines.h"
#include "results/json_integer.h"
#include "results/schema.h"

namespace kvsim::results {

namespace {

const char* const kBanner =
    "# kvsim verify results: one row per request x policy x budget (live, against the full-cache run)";
const char* const kKind = "kvsim verify result file";

const std::vector<std::string> kColumns = {"request",
                                           "task",
                                           "mode",
                                           "policy",
                                           "params",
                                           "budget",
                                           "budget_tokens",
                                           "kept_fraction",
                                           "compressed_bytes",
                                           "budget_bytes",
                                           "steps",
                                           "live_kl",
                                           "max_kl",
                                           "top1",
                                           "ppl",
                                           "reference_ppl",
                                           "task_score",
                                           "reference_task_score",
                                           "same_tokens",
                                           "seconds",
                                           "policy_steps",
                                           "position_fallback",
                                           "budget_semantics",
                                           "decode_peak_bytes",
                                           "generated"};

VerifyConfig parse_config(const std::string& text, const std::string& where) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    throw FormatError(where + ": its '# config:' line is not a JSON object; expected a " + kKind);
  VerifyConfig c;
  const auto string_field = [&](const char* key, const char* fallback) {
    if (!j.contains(key)) return std::string(fallback);
    if (!j[key].is_string())
      throw FormatError(where + ": config field '" + key + "' is " + j[key].dump().substr(0, 80) +
                        ", expected a string");
    return j[key].get<std::string>();
  };
  const auto integer = [&](const char* key, auto& out) {
    if (j.contains(key) && !as_integer(j[key], out))
      throw FormatError(where + ": config field '" + key + "' is " + j[key].dump().substr(0, 80) +
                        ", expected an integer");
  };
  c.schema = 1;
  integer("schema", c.schema);
  check_schema(c.schema, kVerifySchema, where, kKind);
  c.tool = string_field("tool", ""), c.model = string_field("model", ""), c.tasks = string_field("tasks", "");
  c.mode = string_field("mode", ""), c.weights = string_field("weights", ""), c.queries = string_field("queries", "");
  c.device = string_field("device", ""), c.policy_steps = string_field("policy_steps", "");
  integer("max_new", c.max_new), integer("prefill_chunk", c.prefill_chunk), integer("compress_every", c.compress_every);
  integer("min_new", c.min_new);
  c.budget_semantics = string_field("budget_semantics", "point");
  return c;
}

// The configuration line among the comment lines before the column names, if any.
std::optional<VerifyConfig> read_config(const std::string& path) {
  const std::vector<std::string> head = head_lines(path);
  for (std::size_t n = 0; n < head.size(); ++n)
    if (is_config_line(head[n])) return parse_config(config_json(head[n]), path + ":" + std::to_string(n + 1));
  return std::nullopt;
}

VerifyRow parse_row(const CsvReader& csv) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  VerifyRow r;
  r.request = csv.text_or("request"), r.task = csv.text_or("task"), r.mode = csv.text_or("mode");
  r.policy = csv.text_or("policy"), r.params = csv.text_or("params");
  r.budget = csv.number_or("budget", nan), r.budget_tokens = csv.integer_or("budget_tokens", 0);
  r.kept_fraction = csv.number_or("kept_fraction", nan), r.compressed_bytes = csv.number_or("compressed_bytes", nan);
  r.budget_bytes = csv.number_or("budget_bytes", nan), r.steps = csv.integer_or("steps", 0);
  r.live_kl = csv.number_or("live_kl", nan), r.max_kl = csv.number_or("max_kl", nan),
  r.top1 = csv.number_or("top1", nan), r.ppl = csv.number_or("ppl", nan);
  r.reference_ppl = csv.number_or("reference_ppl", nan), r.task_score = csv.number_or("task_score", nan);
  r.reference_task_score = csv.number_or("reference_task_score", nan);
  r.same_tokens = csv.text_or("same_tokens") == "1";
  r.seconds = csv.number_or("seconds", nan), r.policy_steps = csv.text_or("policy_steps");
  r.position_fallback = csv.number_or("position_fallback", nan), r.budget_semantics = csv.text_or("budget_semantics");
  r.decode_peak_bytes = csv.number_or("decode_peak_bytes", nan), r.generated = csv.text_or("generated");
  r.line = csv.line();
  return r;
}

}  // namespace

std::string verify_file_head(const VerifyConfig& c) {
  const nlohmann::json cfg{{"schema", c.schema},
                           {"tool", c.tool},
                           {"model", c.model},
                           {"tasks", c.tasks},
                           {"mode", c.mode},
                           {"max_new", c.max_new},
                           {"min_new", c.min_new},
                           {"weights", c.weights},
                           {"queries", c.queries},
                           {"prefill_chunk", c.prefill_chunk},
                           {"compress_every", c.compress_every},
                           {"budget_semantics", c.budget_semantics},
                           {"device", c.device},
                           {"policy_steps", c.policy_steps}};
  return std::string(kBanner) + "\n" + config_line(cfg.dump()) + "\n" + csv_line(kColumns) + "\n";
}

std::string verify_row_line(const VerifyRow& r) {
  return csv_line({r.request,
                   r.task,
                   r.mode,
                   r.policy,
                   r.params,
                   csv_number(r.budget),
                   std::to_string(r.budget_tokens),
                   csv_number(r.kept_fraction),
                   csv_number(r.compressed_bytes),
                   csv_number(r.budget_bytes),
                   std::to_string(r.steps),
                   csv_number(r.live_kl),
                   csv_number(r.max_kl),
                   csv_number(r.top1),
                   csv_number(r.ppl),
                   csv_number(r.reference_ppl),
                   csv_number(r.task_score),
                   csv_number(r.reference_task_score),
                   r.same_tokens ? "1" : "0",
                   csv_number(r.seconds),
                   r.policy_steps,
                   csv_number(r.position_fallback),
                   r.budget_semantics,
                   csv_number(r.decode_peak_bytes),
                   r.generated});
}

bool is_verify_file(const std::string& path) {
  const std::vector<std::string> head = head_lines(path);
  if (head.empty() || head.back().rfind('#', 0) == 0) return false;
  const std::vector<std::string> names = parse_csv_line(head.back());
  return std::find(names.begin(), names.end(), "live_kl") != names.end();
}

VerifyFile read_verify_file(const std::string& path) {
  VerifyFile f;
  f.path = path;
  f.config = read_config(path);
  CsvReader csv(path, {"request", "mode", "policy", "params", "budget", "live_kl", "top1", "task_score"},
                std::string("a ") + kKind);
  while (csv.next()) f.rows.push_back(parse_row(csv));
  return f;
}

}  // namespace kvsim::results
