#include "results/verify_file.h"

#include <fstream>
#include <iomanip>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/csv.h"
#include "core/error.h"
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
  try {
    c.schema = j.value("schema", 1);
    check_schema(c.schema, kVerifySchema, where, kKind);
    c.tool = j.value("tool", ""), c.model = j.value("model", ""), c.tasks = j.value("tasks", "");
    c.mode = j.value("mode", ""), c.weights = j.value("weights", ""), c.queries = j.value("queries", "");
    c.device = j.value("device", ""), c.policy_steps = j.value("policy_steps", "");
    c.max_new = j.value("max_new", std::int64_t{0}), c.prefill_chunk = j.value("prefill_chunk", std::int64_t{0});
    c.compress_every = j.value("compress_every", std::int64_t{0});
    c.budget_semantics = j.value("budget_semantics", "point");
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(where + ": a configuration field of the wrong type (" + e.what() + "); expected a " + kKind);
  }
  return c;
}

// The configuration line among the comment lines before the column names, if any.
std::optional<VerifyConfig> read_config(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  for (int n = 1; std::getline(in, line) && line.rfind('#', 0) == 0; ++n)
    if (is_config_line(line)) return parse_config(config_json(line), path + ":" + std::to_string(n));
  return std::nullopt;
}

VerifyRow parse_row(const CsvReader& csv) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto text = [&](const char* c) { return csv.has(c) ? csv.text(c) : std::string(); };
  auto number = [&](const char* c) { return csv.has(c) ? csv.number(c) : nan; };
  auto integer = [&](const char* c) { return csv.has(c) ? static_cast<std::int64_t>(csv.number(c)) : 0; };
  VerifyRow r;
  r.request = text("request"), r.task = text("task"), r.mode = text("mode");
  r.policy = text("policy"), r.params = text("params");
  r.budget = number("budget"), r.budget_tokens = integer("budget_tokens");
  r.kept_fraction = number("kept_fraction"), r.compressed_bytes = number("compressed_bytes");
  r.budget_bytes = number("budget_bytes"), r.steps = integer("steps");
  r.live_kl = number("live_kl"), r.max_kl = number("max_kl"), r.top1 = number("top1"), r.ppl = number("ppl");
  r.reference_ppl = number("reference_ppl"), r.task_score = number("task_score");
  r.reference_task_score = number("reference_task_score");
  r.same_tokens = text("same_tokens") == "1";
  r.seconds = number("seconds"), r.policy_steps = text("policy_steps");
  r.position_fallback = number("position_fallback"), r.budget_semantics = text("budget_semantics");
  r.decode_peak_bytes = number("decode_peak_bytes"), r.generated = text("generated");
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
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line) && line.rfind('#', 0) == 0) {
  }
  for (const std::string& name : parse_csv_line(line))
    if (name == "live_kl") return true;
  return false;
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
