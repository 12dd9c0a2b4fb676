#pragma once
// Peak-matched budgets for one-shot policies (docs/budget_semantics.md): after the compression
// point the engine steps a one-shot config like a decode-time one, and this state re-applies the
// policy's own rule whenever the cache would outgrow the byte budget at the next token.
#include <cstdint>
#include <memory>
#include <string>

#include "kvcache/budget.h"
#include "kvcache/config.h"
#include "policies/policy.h"

namespace kvsim::kvcache {

// The state for a one-shot config held to `b` under peak semantics (b.peak_tokens > 0), starting
// from its plan at compression point `c` (one entry per KV head). At a step where some entry is
// full (tokens, or bytes for a codec policy, with no room for one more fp16 token) it asks the
// engine for the signals over the cache as it is (DecodeStep::signals) and plans it at b's
// headroom budget through make_plan, as at the compression point: an eviction policy's drops
// come back from step(), a codec policy's whole plan from retier() (re-encoded from the fp16
// originals). Throws naming the policy when the engine offers no signals.
std::unique_ptr<DecodeState> reapply_state(const ReplayConfig& cfg, const ConfigBudget& b, const LayerPlan& initial,
                                           std::int64_t c, int head_dim);

// How a config's layer steps after the compression point, on either side: `own`, the policy's
// decode-time state (Policy::start_decode), else under peak semantics its one-shot rule re-applied
// (reapply_state), else none (the plan holds to the end). Decode steps one entry per KV head, so
// a per-query-head plan with either is refused, naming the policy.
struct DecodeStart {
  std::unique_ptr<DecodeState> state;
  bool reapplied = false;  // the state re-applies a one-shot rule
};
DecodeStart decode_start(const ReplayConfig& cfg, const ConfigBudget& b, const LayerPlan& plan,
                         std::unique_ptr<DecodeState> own, std::int64_t c, int n_kv_heads, int head_dim);

// Under peak semantics no step after the compression point may hold more than the budget's bytes:
// a config that did is a kvsim bug, refused naming the policy and `where`.
void check_peak_bytes(const ReplayConfig& cfg, const ConfigBudget& b, double peak_bytes, double budget_bytes,
                      const std::string& where);

}  // namespace kvsim::kvcache
