#pragma once
// Hit-rate-only replay (no timing), for fast capacity sweeps (docs/serving.md). Requests are taken
// in file order. A request's hit is the longest run of its blocks, from the first, that is
// cached; then all its blocks are touched or inserted in order. Block hit rate = hit blocks / all
// block references; token hit rate counts each hit block's tokens (a partial tail block its own).
#include <cstdint>
#include <string>

#include "serve/prefix_cache.h"
#include "serve/request_trace.h"

namespace kvsim::serve {

struct HitRateResult {
  std::string eviction;
  std::int64_t capacity = 0;  // blocks
  std::int64_t requests = 0, block_refs = 0, hit_blocks = 0, tokens = 0, hit_tokens = 0, evictions = 0;
  double seconds = 0;
  double block_hit_rate() const {
    return block_refs ? static_cast<double>(hit_blocks) / static_cast<double>(block_refs) : 0.0;
  }
  double token_hit_rate() const { return tokens ? static_cast<double>(hit_tokens) / static_cast<double>(tokens) : 0.0; }
};

// `seconds` covers the cache's set-up (O(blocks)) and the replay; the trace is parsed and its tree
// built once, outside.
HitRateResult hit_rate(const BlockTree& tree, std::int64_t capacity, const EvictionOptions& options);

// The hit rate with unbounded capacity: every block reference after a block's first. Blocks and
// tokens.
struct ReuseCeiling {
  double blocks = 0, tokens = 0;
  std::int64_t distinct_blocks = 0;
};
ReuseCeiling reuse_ceiling(const RequestTrace& trace);

}  // namespace kvsim::serve
