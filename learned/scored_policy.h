#pragma once
// A policy that keeps each KV head's top tokens by a learned per-token score (token_scorer.h):
// foresight's ranking and sigmoid_gate's deployed gates are both this; only what trained the
// network differs.
#include <memory>
#include <string>

#include "policies/params.h"
#include "policies/policy.h"

namespace kvsim::learned {

// The parameters every scored policy takes (model, sinks, window).
std::vector<ParamSpec> scored_policy_params(const std::string& method);
// Builds the policy for `method` from those parameters; throws naming the policy on bad values.
std::unique_ptr<Policy> make_scored_policy(const std::string& method, const Params& p);

}  // namespace kvsim::learned
