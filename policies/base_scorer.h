#pragma once
// Wrapper policies (adakv, structure) re-allocate budgets over another policy's token scores.
// The base's own parameters ride along with '/' since commas separate the wrapper's:
// base=snapkv/window=64/kernel=7 means snapkv:window=64,kernel=7.
#include <memory>
#include <string>

#include "policies/policy.h"

namespace kvsim {

// Builds the base and checks it is a one-shot scoring policy whose selection is its scores alone;
// errors name the wrapper and the parameter.
std::unique_ptr<Policy> make_base_scorer(const std::string& base_param, const std::string& wrapper);

}  // namespace kvsim
