#pragma once
// The byte model a (policy, budget) config is held to, shared by offline replay and live verify
// so both derive the same token budget and count the same bytes for the same plan.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "policies/policy.h"

namespace kvsim {

// When the byte budget holds (docs/budget_semantics.md). Point: at the compression point, as
// the papers evaluate; later tokens join on top (fp16). Peak: at every step from the compression
// point on, decode-time state included; a one-shot policy compresses to `every` tokens below the
// budget and re-applies its rule whenever its cache reaches the budget again.
struct BudgetRule {
  bool peak = false;
  std::int64_t every = 64;   // peak: the one-shot policies' re-application cadence, in tokens
  std::string name() const;  // "point" or "peak/<every>": the CSV's budget_semantics
};
// name() read back ("point", "peak/N" with N >= 1); nullopt for anything else.
std::optional<BudgetRule> budget_rule_from_name(const std::string& name);
// "point" or "peak" (the --budget-semantics value); throws naming the flag otherwise.
BudgetRule parse_budget_rule(const std::string& semantics, std::int64_t every);

struct ConfigBudget {
  bool compress = false;      // false: budget 1.0 or a policy that ignores budgets
  std::int64_t tokens = 0;    // tokens each (layer, KV head) may keep after compressing
  double fraction = 1.0;      // the byte budget the policy is told (Budget::fraction), of the fp16 cache then
  double token_bytes = 0;     // fp16 K/V plus the policy's per-token state
  double head_bytes = 0;      // the policy's fixed state per plan entry and layer
  double kv_token_bytes = 0;  // fp16 K/V of one token in one (layer, KV head)
  // Peak semantics (0 otherwise): the tokens one entry may hold at any step after the compression
  // point, its bytes (as a codec policy counts them) and a one-shot policy's re-application cadence.
  std::int64_t peak_tokens = 0;
  double peak_entry_bytes = 0;
  std::int64_t reapply_every = 0;
  // A policy that selects across layers: its selection over every layer (Budget::across_layers),
  // set by the engine from every layer's Policy::layer_summary before any layer is planned.
  std::shared_ptr<const void> across_layers;

  // What the policy is told at the compression point.
  Budget policy_budget() const { return Budget{tokens, fraction, across_layers}; }
  // Tokens an entry may hold once a decode step is over (the next token must still fit); -1 for a
  // re-applied one-shot policy, whose layer as a whole is held (it may move tokens between heads
  // and layers, as Ada-KV and PyramidKV do).
  std::int64_t rows_after_step() const { return reapply_every > 0 ? -1 : peak_tokens > 0 ? peak_tokens - 1 : tokens; }
};

// For a compression point after `tokens_at_point` tokens: the budget is `fraction` of the full
// fp16 K/V bytes there, less the policy's fixed state, in tokens of K/V + per-token state. Under
// peak semantics the policy keeps headroom below it: one token for a policy that evicts every
// step, its growth between re-tiers (Policy::decode_growth), or the cadence for a one-shot policy
// (at most half the budget). Throws for policies that cannot re-apply (a selection across
// layers, KVzip's reconstruction pass).
ConfigBudget config_budget(const Policy& policy, double fraction, std::int64_t tokens_at_point, int head_dim,
                           const BudgetRule& rule = {}, const std::string& label = {});

// Bytes of a compressed cache: `rows` K/V rows over all layers and entries (per-query-head
// copies each count), plus fixed state for `entries_per_layer` entries in each of `layers`.
double cache_bytes(const ConfigBudget& b, double rows, std::int64_t entries_per_layer, int layers);

// Sliding-window layers (gemma3; docs/models.md) hold at most their window, whatever the policy:
// what they hold at compression point c, per KV head summed over layers...
struct WindowShare {
  std::int64_t local_tokens = 0;  // over the local layers, each at min(c, window)
  std::int64_t held_tokens = 0;   // the full cache: local layers at their window, global ones at c
  int global_layers = 0;
};
WindowShare window_share(const ModelGeometry& g, std::int64_t c);
// ...and the fraction of c a global layer may keep so that the whole cache holds `budget` of the
// full cache's bytes; throws naming `label` when the local layers alone hold more than that.
double global_fraction(double budget, const WindowShare& s, std::int64_t c, const std::string& label);
// Replay and verify refuse on windowed models what they cannot hold yet: policies that select
// across layers. Throws naming `where`.
void check_window_support(const ModelGeometry& g, const Policy& policy, const std::string& label,
                          const std::string& where);
// Peak semantics on windowed models: a local layer's window must be full at the compression point
// c, so that it holds the same bytes at every later step and the global layers' share of the budget
// holds too. Throws naming `where`, the layer and its window otherwise.
void check_window_peak(const ModelGeometry& g, const BudgetRule& rule, std::int64_t c, const std::string& where);

}  // namespace kvsim
