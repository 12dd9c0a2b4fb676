#pragma once
// The prefix cache of one memory tier, as a tree of block states: a block's parent is the block
// before it in every prompt that holds it (block_tree.h, a Boost.Graph over every block of the
// trace). A prefix is never evicted before its suffix: only leaves (cached
// blocks without a cached child) are eviction candidates, and the policy orders them.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "serve/block_tree.h"
#include "serve/cost_model.h"
#include "serve/request_trace.h"

namespace kvsim::serve {

enum class Eviction { Lru, Lfu, Slru, HitsPerToken, Rppc };
// "lru", "lfu", "slru", "hits_per_token", "rppc"; throws naming the value and the choices.
Eviction parse_eviction(const std::string& name);
std::string eviction_name(Eviction e);
const std::vector<std::string>& eviction_names();

struct EvictionOptions {
  Eviction kind = Eviction::Lru;
  double slru_protected = 0.8;   // SLRU: the protected segment's share of the capacity
  PrefillCost cost;              // RPPC: what recomputing a block costs
  double load_ms_per_token = 0;  // RPPC: loading a block from this tier (0 for HBM)
  // RPPC: loading it back from the tier an eviction demotes it to (serve/simulator.h keeps a copy
  // one tier down); < 0 when there is none and a miss recomputes it.
  double demoted_load_ms_per_token = -1;
};

class PrefixCache {
 public:
  // Holds at most `capacity` blocks of the tree's trace (the tree must outlive it); throws for
  // capacity < 1.
  PrefixCache(const BlockTree& tree, std::int64_t capacity, EvictionOptions options);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // Blocks of r cached as a run from its first block: its prefix hit.
  std::size_t cached_prefix(const ServeRequest& r) const;
  // r's blocks touched (cached ones) or inserted (the others), in order, at time `now` (> any
  // earlier call's), evicting leaves as needed. Blocks of r are never evicted for r itself: when
  // every cached block is r's, the rest of r is not cached. Returns the blocks inserted.
  std::int64_t admit(const ServeRequest& r, std::int64_t now);

  // The timed simulation's operations (serve/simulator.h), each at a time later than any earlier
  // call's. The caller keeps the capacity: insert never evicts, evict removes one victim.
  void touch(std::int32_t block, std::int64_t now);   // a hit on a cached block
  void insert(std::int32_t block, std::int64_t now);  // an uncached block; its parent need not be here
  std::int32_t evict(std::int64_t now);               // the policy's victim, or -1 when none is evictable
  // A pinned block (held by a running request) is never a victim. Counted: returns whether the
  // block's pin count went from 0 to 1 (pin) or back to 0 (unpin).
  bool pin(std::int32_t block);
  bool unpin(std::int32_t block);
  bool pinned(std::int32_t block) const;
  std::int32_t cached_children(std::int32_t block) const;  // its children cached here

  bool cached(std::int32_t block) const;
  std::int64_t size() const { return size_; }
  std::int64_t capacity() const { return capacity_; }
  std::int64_t evictions() const { return evictions_; }
  // Blocks evicted so far, in order (kept only after record_evictions()).
  void record_evictions() { record_ = true; }
  const std::vector<std::int32_t>& evicted() const { return evicted_; }

 private:
  struct Impl;
  void advance(std::int64_t now);
  void remove_victim(std::int32_t v);
  std::unique_ptr<Impl> impl_;
  std::int64_t capacity_, size_ = 0, evictions_ = 0;
  bool record_ = false;
  std::vector<std::int32_t> evicted_;
};

}  // namespace kvsim::serve
