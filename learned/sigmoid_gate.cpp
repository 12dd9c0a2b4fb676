// Sigmoid-gated eviction — the seed's soft gates deployed as hard deletions (cf. TRIM-KV's
// retention gate from the hidden state, DMS's straight-through gates). A gate g = sigmoid(MLP(
// token features)) is trained soft, log g added to the attention logits (`kvsim train
// sigmoid_gate`). Rule: keep each KV head's top tokens by g.
#include "learned/scored_policy.h"
#include "policies/registry.h"

namespace kvsim::learned {

KVSIM_REGISTER_POLICY(PolicyInfo{
    "sigmoid_gate", "learned soft retention gates deployed hard: keep each head's top tokens by gate",
    "the seed's sigmoid-gated eviction (cf. TRIM-KV, DMS); model from kvsim train sigmoid_gate",
    scored_policy_params("sigmoid_gate"), [](const Params& p) { return make_scored_policy("sigmoid_gate", p); }});

}  // namespace kvsim::learned
