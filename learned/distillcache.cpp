// DistillCache — the seed's learned eviction: a lightweight policy network over the model's
// internal signals, trained by REINFORCE on a per-step KL reward that preserves the full-cache
// output distribution (no public code; built from the description, `kvsim train distillcache`).
// Rule: keep each KV head's top tokens by the policy network's score (the mode of the
// Plackett-Luce policy it was trained as).
#include "learned/scored_policy.h"
#include "policies/registry.h"

namespace kvsim::learned {

KVSIM_REGISTER_POLICY(PolicyInfo{
    "distillcache", "REINFORCE-trained token scorer (reward: -KL full vs compressed); keep each head's top tokens",
    "the seed's DistillCache (built from its description); model from kvsim train distillcache",
    scored_policy_params("distillcache"), [](const Params& p) { return make_scored_policy("distillcache", p); }});

}  // namespace kvsim::learned
