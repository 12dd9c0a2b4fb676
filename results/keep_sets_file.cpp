#include "results/keep_sets_file.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "results/schema.h"

namespace kvsim::results {

namespace {

const char* const kKind = "kvsim trace keep-sets file";

template <class T>
T get(const nlohmann::json& j, const char* key, const std::string& where, const char* want) {
  if (!j.is_object() || !j.contains(key)) throw FormatError(where + ": no field '" + key + "'; expected a " + kKind);
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    throw FormatError(where + ": field '" + key + "' is " + j.at(key).dump().substr(0, 80) + ", expected " + want);
  }
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
    using Kept = std::vector<std::vector<std::vector<std::int32_t>>>;
    f.configs.push_back({get<std::string>(configs[i], "policy", where, "a string"),
                         get<std::string>(configs[i], "params", where, "a string"),
                         get<std::string>(configs[i], "label", where, "a string"),
                         get<double>(configs[i], "budget", where, "a number"),
                         get<Kept>(configs[i], "kept", where, "[layer][entry] lists of token indices")});
  }
  return f;
}

}  // namespace kvsim::results
