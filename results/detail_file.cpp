#include "results/detail_file.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/text_lines.h"

namespace kvsim::results {

namespace {

const char* const kKind = "kvsim sweep --detail file";

std::string dump(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

template <class T>
T get(const nlohmann::json& j, const char* key, const std::string& where, const char* want, bool required = true) {
  if (!j.contains(key)) {
    if (required) throw FormatError(where + ": no field '" + key + "'; expected a " + kKind + " row");
    return T{};
  }
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    throw FormatError(where + ": field '" + key + "' is " + dump(j.at(key)).substr(0, 80) + ", expected " + want);
  }
}

DetailRow parse_row(const std::string& text, const std::string& where) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    throw FormatError(where + ": not a JSON object; expected a " + kKind + " row");
  using Vec = std::vector<double>;
  DetailRow r;
  r.trace = get<std::string>(j, "trace", where, "a string");
  r.request = get<std::string>(j, "request", where, "a string");
  r.policy = get<std::string>(j, "policy", where, "a string");
  r.budget = get<double>(j, "budget", where, "a number");
  r.layer_kl = get<Vec>(j, "layer_kl", where, "a list of numbers");
  r.layer_out_err = get<Vec>(j, "layer_out_err", where, "a list of numbers");
  // Fields added after the first detail files: empty when absent.
  r.layer_recall = get<Vec>(j, "layer_recall", where, "a list of numbers", false);
  r.layer_out_sq = get<Vec>(j, "layer_out_sq", where, "a list of numbers", false);
  r.layer_p95_kl = get<Vec>(j, "layer_p95_kl", where, "a list of numbers", false);
  r.layer_p95_out_err = get<Vec>(j, "layer_p95_out_err", where, "a list of numbers", false);
  r.head_kl = get<std::vector<Vec>>(j, "head_kl", where, "a list of lists of numbers", false);
  return r;
}

}  // namespace

std::string detail_row_line(const DetailRow& r) {
  return dump(nlohmann::json{{"trace", r.trace},
                             {"request", r.request},
                             {"policy", r.policy},
                             {"budget", r.budget},
                             {"layer_recall", r.layer_recall},
                             {"layer_kl", r.layer_kl},
                             {"head_kl", r.head_kl},
                             {"layer_out_err", r.layer_out_err},
                             {"layer_out_sq", r.layer_out_sq},
                             {"layer_p95_kl", r.layer_p95_kl},
                             {"layer_p95_out_err", r.layer_p95_out_err}});
}

std::string detail_file_head(const SweepConfig& c) { return sweep_config_text(c) + "\n"; }

DetailFile read_detail_file(const std::string& path, TornTail tail) {
  const std::vector<std::string> lines = tail == TornTail::Drop
                                             ? whole_lines(path)
                                             : complete_lines(path,
                                                              "its last line is cut short (the sweep was stopped while "
                                                              "writing); finish it with kvsim sweep ... --resume");
  DetailFile f;
  f.path = path;
  if (lines.empty()) throw FormatError(path + ": empty; expected a " + std::string(kKind) + " (configuration first)");
  // Hand-made files (and some schema-1 tests) start with a row: no configuration, schema 1.
  const nlohmann::json first = nlohmann::json::parse(lines[0], nullptr, false);
  const bool has_config = !(first.is_object() && first.contains("request"));
  if (has_config) {
    f.config_text = lines[0];
    f.config = parse_sweep_config(f.config_text, path + ":1");
  } else {
    f.config.schema = 1;
  }
  for (std::size_t n = has_config ? 1 : 0; n < lines.size(); ++n) {
    if (lines[n].find_first_not_of(" \t\r") == std::string::npos) continue;
    DetailRow r = parse_row(lines[n], path + ":" + std::to_string(n + 1));
    r.line = static_cast<int>(n + 1);
    f.rows.push_back(std::move(r));
    f.lines.push_back(lines[n]);
  }
  return f;
}

}  // namespace kvsim::results
