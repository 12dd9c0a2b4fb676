#pragma once
// Policy parameters as written on the command line: "name:key=value,key=value". Every key has a
// documented default; unknown keys and unparsable values fail naming the policy, the key and
// what was expected.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kvsim {

struct ParamSpec {
  std::string key;
  std::string default_value;
  std::string help;
};

class Params {
 public:
  Params(std::string policy, const std::vector<ParamSpec>& specs, const std::map<std::string, std::string>& given);

  std::int64_t integer(const std::string& key) const;
  double number(const std::string& key) const;
  bool boolean(const std::string& key) const;
  std::string text(const std::string& key) const;
  // One of `choices`, else an error listing them.
  std::string choice(const std::string& key, const std::vector<std::string>& choices) const;
  // The resolved "key=value,..." string (defaults filled in), in spec order.
  std::string canonical() const;
  const std::string& policy() const { return policy_; }

 private:
  const std::string& raw(const std::string& key) const;
  std::string policy_;
  std::vector<std::pair<std::string, std::string>> values_;  // spec order
};

// Splits "name:k=v,k=v" into the name and its key/value pairs (values may not contain ',').
std::pair<std::string, std::map<std::string, std::string>> split_policy_spec(const std::string& spec);

}  // namespace kvsim
