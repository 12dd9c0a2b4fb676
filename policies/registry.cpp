#include "policies/registry.h"

#include <algorithm>

#include "core/error.h"

namespace kvsim {

std::int64_t HeadPlan::kept() const {
  return std::count_if(codec.begin(), codec.end(), [](TokenCodec c) { return c != TokenCodec::Drop; });
}

PolicyRegistry& PolicyRegistry::instance() {
  static PolicyRegistry registry;
  return registry;
}

bool PolicyRegistry::add(PolicyInfo info) {
  for (const auto& existing : infos_)
    if (existing.name == info.name) throw Error("policy '" + info.name + "' registered twice");
  for (const auto& existing : aliases_)
    if (existing.first == info.name) throw Error("policy '" + info.name + "' is already an alias");
  infos_.push_back(std::move(info));
  return true;
}

bool PolicyRegistry::add_alias(std::string alias, std::string name) {
  for (const auto& existing : infos_)
    if (existing.name == alias) throw Error("policy alias '" + alias + "' is the name of a policy");
  for (const auto& existing : aliases_)
    if (existing.first == alias) throw Error("policy alias '" + alias + "' registered twice");
  aliases_.emplace_back(std::move(alias), std::move(name));
  return true;
}

std::vector<std::string> PolicyRegistry::aliases_of(const std::string& name) const {
  std::vector<std::string> out;
  for (const auto& [alias, target] : aliases_)
    if (target == name) out.push_back(alias);
  return out;
}

const PolicyInfo& PolicyRegistry::find(const std::string& name) const {
  for (const auto& info : infos_)
    if (info.name == name) return info;
  for (const auto& [alias, target] : aliases_)
    if (alias == name) {
      for (const auto& info : infos_)
        if (info.name == target) return info;
      throw Error("policy alias '" + alias + "' names '" + target + "', which is not a policy");
    }
  std::string valid;
  for (const auto* info : all()) valid += (valid.empty() ? "" : ", ") + info->name;
  std::string aliases;
  for (const auto& [alias, target] : aliases_) aliases += (aliases.empty() ? "" : ", ") + alias + " = " + target;
  throw Error("unknown policy '" + name + "'; valid policies: " + valid +
              (aliases.empty() ? "" : "; aliases: " + aliases));
}

std::vector<const PolicyInfo*> PolicyRegistry::all() const {
  std::vector<const PolicyInfo*> out;
  for (const auto& info : infos_) out.push_back(&info);
  std::sort(out.begin(), out.end(), [](auto* a, auto* b) { return a->name < b->name; });
  return out;
}

std::string PolicyRegistry::compact_label(const std::string& name, const std::string& canonical_params) const {
  const PolicyInfo& info = find(name);
  const auto given = split_policy_spec(name + (canonical_params.empty() ? "" : ":" + canonical_params)).second;
  std::string changed;
  for (const auto& spec : info.params) {
    const auto it = given.find(spec.key);
    if (it != given.end() && it->second != spec.default_value)
      changed += (changed.empty() ? "" : ",") + spec.key + "=" + it->second;
  }
  return changed.empty() ? name : name + ":" + changed;
}

std::string table_label(const std::string& label) {
  std::string out = label;
  for (auto at = out.find("model="); at != std::string::npos; at = out.find("model=", at + 6)) {
    const auto start = at + 6, end = std::min(out.find(',', start), out.size());
    const auto slash = out.rfind('/', end - 1);
    if (slash != std::string::npos && slash >= start) out.erase(start, slash + 1 - start);
  }
  return out;
}

PolicyInstance PolicyRegistry::create(const std::string& spec) const {
  auto [name, given] = split_policy_spec(spec);
  const PolicyInfo& info = find(name);
  const Params params(info.name, info.params, given);
  PolicyInstance inst;
  inst.name = info.name;
  inst.params = params.canonical();
  inst.policy = info.make(params);
  return inst;
}

}  // namespace kvsim
