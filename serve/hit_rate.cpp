#include "serve/hit_rate.h"

#include <chrono>

namespace kvsim::serve {

HitRateResult hit_rate(const BlockTree& tree, std::int64_t capacity, const EvictionOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  const RequestTrace& trace = tree.trace();
  PrefixCache cache(tree, capacity, options);
  HitRateResult out;
  out.eviction = eviction_name(options.kind);
  out.capacity = capacity;
  std::int64_t now = 0;
  for (const ServeRequest& r : trace.requests) {
    const std::size_t hit = cache.cached_prefix(r);
    out.block_refs += static_cast<std::int64_t>(r.blocks.size());
    out.hit_blocks += static_cast<std::int64_t>(hit);
    out.tokens += r.input_tokens;
    for (std::size_t i = 0; i < hit; ++i) out.hit_tokens += trace.tokens[static_cast<std::size_t>(r.blocks[i])];
    cache.admit(r, now++);
  }
  out.requests = static_cast<std::int64_t>(trace.requests.size());
  out.evictions = cache.evictions();
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

ReuseCeiling reuse_ceiling(const RequestTrace& trace) {
  std::vector<std::uint8_t> seen(trace.blocks(), 0);
  std::int64_t refs = 0, repeat = 0, tokens = 0, repeat_tokens = 0;
  for (const ServeRequest& r : trace.requests) {
    tokens += r.input_tokens;
    for (std::size_t i = 0; i < r.blocks.size(); ++i) {
      ++refs;
      auto& s = seen[static_cast<std::size_t>(r.blocks[i])];
      if (s) {
        ++repeat;
        repeat_tokens += trace.tokens[static_cast<std::size_t>(r.blocks[i])];
      }
      s = 1;
    }
  }
  ReuseCeiling c;
  c.distinct_blocks = static_cast<std::int64_t>(trace.blocks());
  c.blocks = refs ? static_cast<double>(repeat) / static_cast<double>(refs) : 0.0;
  c.tokens = tokens ? static_cast<double>(repeat_tokens) / static_cast<double>(tokens) : 0.0;
  return c;
}

}  // namespace kvsim::serve
