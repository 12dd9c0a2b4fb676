#include "policies/params.h"

#include <algorithm>
#include <charconv>

#include "core/error.h"

namespace kvsim {

Params::Params(std::string policy, const std::vector<ParamSpec>& specs, const std::map<std::string, std::string>& given)
    : policy_(std::move(policy)) {
  for (const auto& entry : given) {
    const std::string& key = entry.first;  // a named reference: clang 14 cannot capture a structured binding
    const bool known = std::any_of(specs.begin(), specs.end(), [&](const ParamSpec& s) { return s.key == key; });
    if (!known) {
      std::string valid;
      for (const auto& s : specs) valid += (valid.empty() ? "" : ", ") + s.key;
      throw Error("policy " + policy_ + ": unknown parameter '" + key +
                  "'; valid: " + (valid.empty() ? std::string("none") : valid));
    }
  }
  for (const auto& s : specs) {
    const auto it = given.find(s.key);
    values_.emplace_back(s.key, it == given.end() ? s.default_value : it->second);
  }
}

const std::string& Params::raw(const std::string& key) const {
  for (const auto& [k, v] : values_)
    if (k == key) return v;
  throw Error("policy " + policy_ + ": internal: parameter '" + key + "' has no spec");
}

std::int64_t Params::integer(const std::string& key) const {
  const std::string& v = raw(key);
  std::int64_t out = 0;
  const auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc() || ptr != v.data() + v.size())
    throw Error("policy " + policy_ + ": parameter '" + key + "' = '" + v + "', expected an integer");
  return out;
}

double Params::number(const std::string& key) const {
  const std::string& v = raw(key);
  try {
    std::size_t used = 0;
    const double out = std::stod(v, &used);
    if (used == v.size()) return out;
  } catch (const std::exception&) {
  }
  throw Error("policy " + policy_ + ": parameter '" + key + "' = '" + v + "', expected a number");
}

bool Params::boolean(const std::string& key) const {
  const std::string& v = raw(key);
  if (v == "true" || v == "1" || v == "on") return true;
  if (v == "false" || v == "0" || v == "off") return false;
  throw Error("policy " + policy_ + ": parameter '" + key + "' = '" + v + "', expected true or false");
}

std::string Params::text(const std::string& key) const { return raw(key); }

std::string Params::choice(const std::string& key, const std::vector<std::string>& choices) const {
  const std::string& v = raw(key);
  if (std::find(choices.begin(), choices.end(), v) != choices.end()) return v;
  std::string list;
  for (const auto& c : choices) list += (list.empty() ? "" : " | ") + c;
  throw Error("policy " + policy_ + ": parameter '" + key + "' = '" + v + "', expected " + list);
}

std::string Params::canonical() const {
  std::string s;
  for (const auto& [k, v] : values_) s += (s.empty() ? "" : ",") + k + "=" + v;
  return s;
}

std::pair<std::string, std::map<std::string, std::string>> split_policy_spec(const std::string& spec) {
  const auto colon = spec.find(':');
  std::string name = spec.substr(0, colon);
  std::map<std::string, std::string> kv;
  if (colon == std::string::npos) return {name, kv};
  const std::string rest = spec.substr(colon + 1);
  std::size_t start = 0;
  while (start <= rest.size()) {
    const auto comma = rest.find(',', start);
    const std::string item = rest.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const auto eq = item.find('=');
    if (item.empty() || eq == std::string::npos || eq == 0)
      throw Error("policy spec '" + spec + "': '" + item + "' is not key=value");
    if (!kv.emplace(item.substr(0, eq), item.substr(eq + 1)).second)
      throw Error("policy spec '" + spec + "': parameter '" + item.substr(0, eq) + "' given twice");
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return {name, kv};
}

}  // namespace kvsim
