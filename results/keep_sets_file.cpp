#include "results/keep_sets_file.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "results/json_integer.h"
#include "results/schema.h"

namespace kvsim::results {

namespace {

const char* const kKind = "kvsim trace keep-sets file";

template <class T>
T get(const nlohmann::json& j, const char* key, const std::string& where, const char* want) {
  if (!j.is_object() || !j.contains(key)) throw FormatError(where + ": no field '" + key + "'; expected a " + kKind);
  const nlohmann::json& v = j.at(key);
  T out{};
  if (json_value(v, out)) return out;
  throw FormatError(where + ": field '" + key + "' is " + v.dump().substr(0, 80) + ", expected " + want);
}

// [layer][entry] lists of token indices, each an integer >= 0.
std::vector<std::vector<std::vector<std::int32_t>>> kept_sets(const nlohmann::json& j, const std::string& where) {
  const auto bad = [&] {
    return FormatError(where + ": field 'kept' is not [layer][entry] lists of token indices (integers >= 0)");
  };
  if (!j.is_object() || !j.contains("kept") || !j["kept"].is_array()) throw bad();
  std::vector<std::vector<std::vector<std::int32_t>>> out;
  for (const auto& layer : j["kept"]) {
    if (!layer.is_array()) throw bad();
    auto& l = out.emplace_back();
    for (const auto& entry : layer) {
      if (!entry.is_array()) throw bad();
      auto& e = l.emplace_back();
      for (const auto& token : entry) {
        std::int32_t t = -1;
        if (!as_integer(token, t) || t < 0) throw bad();
        e.push_back(t);
      }
    }
  }
  return out;
}

}  // namespace

std::string keep_sets_text(const KeepSetsFile& f) {
  nlohmann::json j = {{"schema", f.schema}, {"trace", f.trace},   {"request", f.request},
                      {"mode", f.mode},     {"tokens", f.tokens}, {"compression_point", f.compression_point},
                      {"layers", f.layers}, {"layer", f.layer},   {"configs", nlohmann::json::array()}};
  for (const KeptConfig& c : f.configs)
    j["configs"].push_back(
        {{"policy", c.policy}, {"params", c.params}, {"label", c.label}, {"budget", c.budget}, {"kept", c.kept}});
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

KeepSetsFile read_keep_sets_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot open; expected a " + std::string(kKind));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(path + ": not valid JSON (" + e.what() + "); expected a " + kKind);
  }
  KeepSetsFile f;
  f.schema = j.is_object() && j.contains("schema") ? get<int>(j, "schema", path, "an integer") : 1;
  check_schema(f.schema, kKeepSetsSchema, path, kKind);
  f.trace = get<std::string>(j, "trace", path, "a string");
  f.request = get<std::string>(j, "request", path, "a string");
  f.mode = get<std::string>(j, "mode", path, "a string");
  f.tokens = get<std::int64_t>(j, "tokens", path, "an integer");
  f.compression_point = get<std::int64_t>(j, "compression_point", path, "an integer");
  f.layers = get<int>(j, "layers", path, "an integer");
  f.layer = get<int>(j, "layer", path, "an integer");
  const auto configs = get<std::vector<nlohmann::json>>(j, "configs", path, "a list");
  for (std::size_t i = 0; i < configs.size(); ++i) {
    const std::string where = path + ": configs[" + std::to_string(i) + "]";
    f.configs.push_back({get<std::string>(configs[i], "policy", where, "a string"),
                         get<std::string>(configs[i], "params", where, "a string"),
                         get<std::string>(configs[i], "label", where, "a string"),
                         get<double>(configs[i], "budget", where, "a number"), kept_sets(configs[i], where)});
  }
  return f;
}

}  // namespace kvsim::results
