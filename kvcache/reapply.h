#pragma once
// Peak-matched budgets for one-shot policies (docs/budget_semantics.md): after the compression
// point the engine steps a one-shot config like a decode-time one, and this state re-applies the
// policy's own rule whenever the cache would outgrow the byte budget at the next token.
#include <cstdint>
#include <memory>

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

}  // namespace kvsim::kvcache
