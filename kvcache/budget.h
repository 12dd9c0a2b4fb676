#pragma once
// The byte model a (policy, budget) config is held to, shared by offline replay and live verify
// so both derive the same token budget and count the same bytes for the same plan.
#include <cstdint>
#include <memory>

#include "policies/policy.h"

namespace kvsim {

struct ConfigBudget {
  bool compress = false;          // false: budget 1.0 or a policy that ignores budgets
  std::int64_t tokens = 0;        // tokens each (layer, KV head) may keep after compressing
  double token_bytes = 0;         // fp16 K/V plus the policy's per-token state
  double head_bytes = 0;          // the policy's fixed state per plan entry and layer
  double kv_token_bytes = 0;      // fp16 K/V of one token in one (layer, KV head)
  // A policy that selects across layers: its selection over every layer (Budget::across_layers),
  // set by the engine from every layer's Policy::layer_summary before any layer is planned.
  std::shared_ptr<const void> across_layers;
};

// For a compression point after `tokens_at_point` tokens: the budget is `fraction` of the full
// fp16 K/V bytes there, less the policy's fixed state, in tokens of K/V + per-token state.
ConfigBudget config_budget(const Policy& policy, double fraction, std::int64_t tokens_at_point, int head_dim);

// Bytes of a compressed cache: `rows` K/V rows over all layers and entries (per-query-head
// copies each count), plus fixed state for `entries_per_layer` entries in each of `layers`.
double cache_bytes(const ConfigBudget& b, double rows, std::int64_t entries_per_layer, int layers);

}  // namespace kvsim
