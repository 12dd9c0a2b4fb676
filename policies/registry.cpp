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
  infos_.push_back(std::move(info));
  return true;
}

const PolicyInfo& PolicyRegistry::find(const std::string& name) const {
  for (const auto& info : infos_)
    if (info.name == name) return info;
  std::string valid;
  for (const auto* info : all()) valid += (valid.empty() ? "" : ", ") + info->name;
  throw Error("unknown policy '" + name + "'; valid policies: " + valid);
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

PolicyInstance PolicyRegistry::create(const std::string& spec) const {
  auto [name, given] = split_policy_spec(spec);
  const PolicyInfo& info = find(name);
  const Params params(name, info.params, given);
  PolicyInstance inst;
  inst.name = name;
  inst.params = params.canonical();
  inst.policy = info.make(params);
  return inst;
}

}  // namespace kvsim
