#pragma once
// How a request's prompt state is materialised in HBM, as a shortest path (docs/serving.md).
// State i = "the first i blocks are in HBM". Each block can get there in several ways, each an
// edge of weighted cost: it is already in HBM (free), it is loaded from host DRAM or SSD (a run of
// blocks in one tier is one transfer: the tier's latency once, then bytes / bandwidth), it is
// recomputed after its prefix (the prefill cost model), or it is reached by a transition from a
// cached sibling (a block after the same prefix): the sibling is loaded and only the share of its
// tokens that differ is recomputed, CacheBlend-style. The cheapest path from state 0 to state n,
// found by Boost.Graph's DAG shortest paths, says which way each block takes.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "serve/cost_model.h"

namespace kvsim::serve {

enum class Way { Hbm = 0, LoadDram, LoadSsd, Recompute, Transition };
constexpr int kWays = 5;
std::string way_name(Way w);  // "hbm", "dram", "ssd", "recompute", "transition"

// Where each tier is: 0 = HBM, 1 = host DRAM, 2 = SSD.
constexpr int kTiers = 3;
struct Link {
  double gbps = 0;        // GB/s into HBM; 0: the tier is absent
  double latency_ms = 0;  // per transfer
  double ms(double bytes) const { return latency_ms + bytes / (gbps * 1e6); }
};

// One block of a request, as the planner sees it.
struct BlockState {
  std::int64_t start = 0, tokens = 0;  // its first token's position, its token count
  double bytes = 0;                    // its KV bytes as held (compressed, paged)
  std::array<bool, kTiers> in{};       // cached in HBM / DRAM / SSD
  int sibling_tier = -1;               // the fastest tier holding a sibling, -1 for none
  std::int32_t sibling = -1;           // that sibling (for the caller; the planner reads its bytes)
  double sibling_bytes = 0;
};

struct MaterializeCosts {
  PrefillCost prefill;
  std::array<Link, kTiers> links;  // links[0] unused (HBM is free)
  bool transitions = false;
  double transition_diff = 0.25;  // the share of a sibling's tokens recomputed in a transition
};

struct MaterializePlan {
  std::vector<Way> way;          // per block
  double ms = 0;                 // the path's cost
  double recompute_only_ms = 0;  // HBM blocks reused, every other block recomputed
  double load_only_ms = 0;       // HBM reused, then any block in a tier loaded, the rest recomputed
};

// The cheapest way to materialise the blocks, in order. A transition is offered only where
// costs.transitions is set and the block has a cached sibling; a load only where its tier has a
// link.
MaterializePlan plan_materialization(const std::vector<BlockState>& blocks, const MaterializeCosts& costs);

// Tokens a transition recomputes of a block of `tokens` tokens.
std::int64_t transition_tokens(std::int64_t tokens, double diff);

}  // namespace kvsim::serve
