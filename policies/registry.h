#pragma once
// Self-registering policy registry. A policy is one .cpp file with one KVSIM_REGISTER_POLICY
// line, and replay, verify and the CLI find policies through the registry only (the trainers
// name the learned method whose model file they write). policies/ is a static archive linked
// whole (WHOLE_ARCHIVE) by kvcache/, and with learned/ by every program (kvsim_all_policies), so
// the linker keeps every registration.
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "policies/params.h"
#include "policies/policy.h"

namespace kvsim {

struct PolicyInfo {
  std::string name;
  std::string description;  // one line: the rule
  std::string citation;     // paper (and the reference code the rule was read from)
  std::vector<ParamSpec> params;
  std::function<std::unique_ptr<Policy>(const Params&)> make;
};

// A policy built from a spec, with its resolved parameters.
struct PolicyInstance {
  std::string name;
  std::string params;  // canonical "key=value,..." with defaults filled in
  std::unique_ptr<Policy> policy;
  std::string label() const { return params.empty() ? name : name + ":" + params; }
};

class PolicyRegistry {
 public:
  static PolicyRegistry& instance();
  bool add(PolicyInfo info);
  // Another name for a registered policy (the name a paper or an issue uses); results carry the
  // canonical name.
  bool add_alias(std::string alias, std::string name);
  // The other names `name` is known by.
  std::vector<std::string> aliases_of(const std::string& name) const;
  // Throws naming the unknown policy and listing the valid ones.
  const PolicyInfo& find(const std::string& name) const;
  std::vector<const PolicyInfo*> all() const;  // sorted by name
  // "name" or "name:key=value,...".
  PolicyInstance create(const std::string& spec) const;
  // "name" plus only the parameters that differ from their defaults: for tables.
  std::string compact_label(const std::string& name, const std::string& canonical_params) const;

 private:
  std::vector<PolicyInfo> infos_;
  std::vector<std::pair<std::string, std::string>> aliases_;  // (alias, canonical name)
};

// A label as tables print it: a `model=` file (learned policies) by its file name, the rest as is.
std::string table_label(const std::string& label);

}  // namespace kvsim

#define KVSIM_POLICY_CONCAT_(a, b) a##b
#define KVSIM_POLICY_CONCAT(a, b) KVSIM_POLICY_CONCAT_(a, b)
// Registers a policy at static-initialisation time: KVSIM_REGISTER_POLICY(PolicyInfo{...});
#define KVSIM_REGISTER_POLICY(...)                                                             \
  static const bool KVSIM_POLICY_CONCAT(kvsim_policy_registered_, __LINE__) [[maybe_unused]] = \
      ::kvsim::PolicyRegistry::instance().add(__VA_ARGS__)
// KVSIM_REGISTER_POLICY_ALIAS("other_name", "name"): `other_name` selects the policy `name`.
#define KVSIM_REGISTER_POLICY_ALIAS(alias, name)                                          \
  static const bool KVSIM_POLICY_CONCAT(kvsim_policy_alias_, __LINE__) [[maybe_unused]] = \
      ::kvsim::PolicyRegistry::instance().add_alias(alias, name)
