#include "serve/prefix_cache.h"

#include <algorithm>
#include <deque>
#include <queue>
#include <utility>

#include "core/error.h"

namespace kvsim::serve {

namespace {

const std::vector<std::string> kNames = {"lru", "lfu", "slru", "hits_per_token", "rppc"};

// The eviction candidates (the leaves) in an indexed 4-ary min-heap: each leaf's key is updated in
// place when it is touched, so the heap never holds more than the cached blocks. Order: the
// smallest (first, second) goes first, then the deeper block, then the higher id.
class LeafHeap {
 public:
  void resize(std::size_t blocks) { pos_.assign(blocks, -1); }
  bool empty() const { return heap_.empty(); }
  std::int32_t top() const { return heap_.front().block; }
  void put(std::int32_t b, double first, double second, std::int32_t depth) {  // insert, or re-key
    std::int64_t i = pos_[static_cast<std::size_t>(b)];
    const Entry e{first, second, depth, b};
    if (i < 0) {
      i = static_cast<std::int64_t>(heap_.size());
      heap_.push_back(e);
    }
    sift_down(sift_up(i, e), e);
  }
  void remove(std::int32_t b) {
    const std::int64_t i = pos_[static_cast<std::size_t>(b)];
    if (i < 0) return;
    pos_[static_cast<std::size_t>(b)] = -1;
    const Entry moved = heap_.back();
    heap_.pop_back();
    if (static_cast<std::size_t>(i) == heap_.size()) return;
    sift_down(sift_up(i, moved), moved);
  }

 private:
  // Keys live in the heap itself, so a comparison reads contiguous memory.
  struct Entry {
    double first, second;
    std::int32_t depth, block;
    bool before(const Entry& o) const {
      if (first != o.first) return first < o.first;
      if (second != o.second) return second < o.second;
      if (depth != o.depth) return depth > o.depth;
      return block > o.block;
    }
  };
  void place(std::int64_t i, const Entry& e) {
    heap_[static_cast<std::size_t>(i)] = e;
    pos_[static_cast<std::size_t>(e.block)] = i;
  }
  // Where e goes at or above slot i (the entries it passes move down), not yet placed.
  std::int64_t sift_up(std::int64_t i, const Entry& e) {
    while (i > 0) {
      const std::int64_t p = (i - 1) / 4;
      if (!e.before(heap_[static_cast<std::size_t>(p)])) break;
      place(i, heap_[static_cast<std::size_t>(p)]);
      i = p;
    }
    return i;
  }
  void sift_down(std::int64_t i, const Entry& e) {
    const auto n = static_cast<std::int64_t>(heap_.size());
    for (;;) {
      const std::int64_t c0 = 4 * i + 1;
      if (c0 >= n) break;
      std::int64_t best = c0;
      for (std::int64_t c = c0 + 1; c < std::min(n, c0 + 4); ++c)
        if (heap_[static_cast<std::size_t>(c)].before(heap_[static_cast<std::size_t>(best)])) best = c;
      if (!heap_[static_cast<std::size_t>(best)].before(e)) break;
      place(i, heap_[static_cast<std::size_t>(best)]);
      i = best;
    }
    place(i, e);
  }
  std::vector<Entry> heap_;
  std::vector<std::int64_t> pos_;
};

}  // namespace

Eviction parse_eviction(const std::string& name) {
  for (std::size_t i = 0; i < kNames.size(); ++i)
    if (name == kNames[i]) return static_cast<Eviction>(i);
  std::string all;
  for (const auto& n : kNames) all += (all.empty() ? "" : ", ") + n;
  throw Error("eviction policy '" + name + "' is unknown; expected one of: " + all);
}

std::string eviction_name(Eviction e) { return kNames.at(static_cast<std::size_t>(e)); }
const std::vector<std::string>& eviction_names() { return kNames; }

struct PrefixCache::Impl {
  const BlockTree& tree;
  const RequestTrace& trace;
  EvictionOptions o;
  std::vector<std::uint8_t> cached, prot;
  std::vector<std::int32_t> cached_children, pins;
  std::vector<std::int64_t> last, hits;
  std::vector<std::uint32_t> prot_version;
  LeafHeap leaves;
  // LRU only: leaves offered at the current time arrive in key order, so they queue in O(1); the
  // heap keeps only parents re-exposed with an older key. Entries whose block has since been
  // evicted, covered or touched again are skipped when they reach the front.
  std::deque<std::pair<std::int32_t, std::int64_t>> fresh;
  std::int64_t now = -1;
  // SLRU's protected segment by last use: (last, block, version), oldest on top.
  using ProtEntry = std::tuple<std::int64_t, std::int32_t, std::uint32_t>;
  std::priority_queue<ProtEntry, std::vector<ProtEntry>, std::greater<>> protected_lru;
  std::int64_t protected_count = 0, protected_cap = 0;

  Impl(const BlockTree& bt, EvictionOptions opts) : tree(bt), trace(bt.trace()), o(opts) {
    const std::size_t n = trace.blocks();
    cached.assign(n, 0);
    prot.assign(n, 0);
    cached_children.assign(n, 0);
    pins.assign(n, 0);
    last.assign(n, -1);
    hits.assign(n, 0);
    prot_version.assign(n, 0);
    leaves.resize(n);
  }

  // b's place in the eviction order: (first, second), the smallest evicted first.
  std::pair<double, double> key(std::int32_t b) const {
    const auto u = static_cast<std::size_t>(b);
    const auto l = static_cast<double>(last[u]), h = static_cast<double>(hits[u]),
               t = static_cast<double>(trace.tokens[u]);
    switch (o.kind) {
      case Eviction::Lru:
        return {l, 0.0};
      case Eviction::Lfu:
        return {h, l};
      case Eviction::Slru:
        return {static_cast<double>(prot[u]), l};
      case Eviction::HitsPerToken:
        return {h / t, l};
      case Eviction::Rppc: {
        // Value = frequency x latency benefit / footprint; the benefit is what a hit here saves
        // against the miss an eviction leaves: reloading the demoted copy from the tier below,
        // or recomputing the block after its cached prefix, whichever is cheaper.
        double miss = o.cost.recompute_ms(trace.start[u], trace.tokens[u]);
        if (o.demoted_load_ms_per_token >= 0) miss = std::min(miss, o.demoted_load_ms_per_token * t);
        return {h * std::max(0.0, miss - o.load_ms_per_token * t) / t, l};
      }
    }
    return {l, 0.0};
  }

  // A cached leaf no running request holds.
  bool is_leaf(std::int32_t b) const {
    const auto u = static_cast<std::size_t>(b);
    return cached[u] && cached_children[u] == 0 && pins[u] == 0;
  }
  void offer(std::int32_t b) {  // b's key changed, or b became an unpinned leaf
    if (!is_leaf(b)) return;
    if (o.kind == Eviction::Lru && last[static_cast<std::size_t>(b)] == now) {
      leaves.remove(b);
      fresh.emplace_back(b, now);
      return;
    }
    const auto [first, second] = key(b);
    leaves.put(b, first, second, trace.depth[static_cast<std::size_t>(b)]);
  }

  // The next leaf to evict, out of the eviction order (-1: none but the current request's, which
  // go to `pinned` when met in the heap).
  std::int32_t victim(std::vector<std::int32_t>& pinned) {
    while (!fresh.empty()) {  // drop stale entries at the front
      const auto [b, at] = fresh.front();
      if (is_leaf(b) && last[static_cast<std::size_t>(b)] == at) break;
      fresh.pop_front();
    }
    const bool queued = !fresh.empty() && fresh.front().second < now;  // (the queue's front is never pinned)
    while (!leaves.empty()) {
      const std::int32_t h = leaves.top();
      if (queued && fresh.front().second < last[static_cast<std::size_t>(h)]) break;
      leaves.remove(h);
      if (last[static_cast<std::size_t>(h)] != now) return h;
      pinned.push_back(h);
    }
    if (!queued) return -1;
    const std::int32_t b = fresh.front().first;
    fresh.pop_front();
    leaves.remove(b);  // a copy re-offered with the same key, if any
    return b;
  }

  void hit(std::int32_t b, std::int64_t at) {
    const auto u = static_cast<std::size_t>(b);
    ++hits[u];
    last[u] = at;
    if (o.kind == Eviction::Slru) protect(b);  // a hit promotes (or refreshes) it
    offer(b);
  }
  void add(std::int32_t b, std::int64_t at) {
    const auto u = static_cast<std::size_t>(b);
    cached[u] = 1;
    hits[u] = 1;
    last[u] = at;
    if (const std::int32_t p = tree.parent(b); p >= 0 && cached_children[static_cast<std::size_t>(p)]++ == 0)
      leaves.remove(p);  // no longer a leaf
    offer(b);
  }
  void drop(std::int32_t v) {  // v, a victim, leaves the cache
    const auto w = static_cast<std::size_t>(v);
    cached[w] = 0;
    hits[w] = 0;
    if (prot[w]) {
      prot[w] = 0;
      --protected_count;
    }
    if (const std::int32_t p = tree.parent(v); p >= 0 && --cached_children[static_cast<std::size_t>(p)] == 0) offer(p);
  }

  // Whether a protected-queue entry still stands for its block (not evicted, demoted or re-queued).
  bool current(const ProtEntry& e) const {
    const auto w = static_cast<std::size_t>(std::get<1>(e));
    return cached[w] && prot[w] && std::get<2>(e) == prot_version[w];
  }

  void protect(std::int32_t b) {
    const auto u = static_cast<std::size_t>(b);
    if (!prot[u]) {
      prot[u] = 1;
      ++protected_count;
    }
    protected_lru.emplace(last[u], b, ++prot_version[u]);
    if (protected_lru.size() > 4 * static_cast<std::size_t>(protected_cap) + 64) {  // drop superseded entries
      std::vector<ProtEntry> live;
      for (; !protected_lru.empty(); protected_lru.pop())
        if (current(protected_lru.top())) live.push_back(protected_lru.top());
      protected_lru = decltype(protected_lru)(std::greater<>(), std::move(live));
    }
    while (protected_count > protected_cap && !protected_lru.empty()) {
      const ProtEntry e = protected_lru.top();
      protected_lru.pop();
      if (!current(e)) continue;
      const std::int32_t v = std::get<1>(e);
      prot[static_cast<std::size_t>(v)] = 0;  // demoted to the probationary segment
      --protected_count;
      offer(v);
    }
  }
};

PrefixCache::PrefixCache(const BlockTree& tree, std::int64_t capacity, EvictionOptions options)
    : impl_(std::make_unique<Impl>(tree, options)), capacity_(capacity) {
  if (capacity < 1) throw Error("prefix cache: capacity " + std::to_string(capacity) + " blocks; expected >= 1");
  if (!(options.slru_protected > 0 && options.slru_protected <= 1))
    throw Error("prefix cache: SLRU protected share " + std::to_string(options.slru_protected) + "; expected (0, 1]");
  impl_->protected_cap =
      std::max<std::int64_t>(1, static_cast<std::int64_t>(options.slru_protected * static_cast<double>(capacity)));
}

PrefixCache::~PrefixCache() = default;

bool PrefixCache::cached(std::int32_t block) const { return impl_->cached.at(static_cast<std::size_t>(block)) != 0; }

std::size_t PrefixCache::cached_prefix(const ServeRequest& r) const {
  std::size_t i = 0;
  while (i < r.blocks.size() && impl_->cached[static_cast<std::size_t>(r.blocks[i])]) ++i;
  return i;
}

std::int64_t PrefixCache::admit(const ServeRequest& r, std::int64_t now) {
  Impl& m = *impl_;
  advance(now);
  std::int64_t inserted = 0;
  std::vector<std::int32_t> pinned;  // leaves of r itself met while looking for a victim
  for (const std::int32_t b : r.blocks) {
    if (m.cached[static_cast<std::size_t>(b)]) {
      m.hit(b, now);
      continue;
    }
    while (size_ >= capacity_) {
      const std::int32_t v = m.victim(pinned);
      if (v < 0) break;
      remove_victim(v);
    }
    for (const std::int32_t v : pinned) m.offer(v);
    pinned.clear();
    if (size_ >= capacity_) break;  // every cached block is r's: the rest of r stays uncached
    m.add(b, now);
    ++size_;
    ++inserted;
  }
  return inserted;
}

void PrefixCache::advance(std::int64_t now) {
  if (now <= impl_->now)  // equal times would pin another request's blocks
    throw Error("prefix cache: time " + std::to_string(now) + " after time " + std::to_string(impl_->now) +
                "; expected increasing times");
  impl_->now = now;
}

void PrefixCache::remove_victim(std::int32_t v) {
  impl_->drop(v);
  --size_;
  ++evictions_;
  if (record_) evicted_.push_back(v);
}

void PrefixCache::touch(std::int32_t block, std::int64_t now) {
  if (!cached(block)) throw Error("prefix cache: touch of block " + std::to_string(block) + ", which is not cached");
  advance(now);
  impl_->hit(block, now);
}

void PrefixCache::insert(std::int32_t block, std::int64_t now) {
  if (cached(block)) throw Error("prefix cache: insert of block " + std::to_string(block) + ", which is cached");
  advance(now);
  impl_->add(block, now);
  ++size_;
}

std::int32_t PrefixCache::evict(std::int64_t now) {
  advance(now);
  std::vector<std::int32_t> none;  // nothing carries the new time yet, so nothing is pinned by it
  const std::int32_t v = impl_->victim(none);
  if (v >= 0) remove_victim(v);
  return v;
}

bool PrefixCache::pin(std::int32_t block) {
  Impl& m = *impl_;
  if (!cached(block)) throw Error("prefix cache: pin of block " + std::to_string(block) + ", which is not cached");
  if (m.pins[static_cast<std::size_t>(block)]++ > 0) return false;
  m.leaves.remove(block);  // a queued LRU entry is skipped when it reaches the front
  return true;
}

bool PrefixCache::unpin(std::int32_t block) {
  Impl& m = *impl_;
  auto& n = m.pins.at(static_cast<std::size_t>(block));
  if (n == 0) throw Error("prefix cache: unpin of block " + std::to_string(block) + ", which is not pinned");
  if (--n > 0) return false;
  m.offer(block);
  return true;
}

bool PrefixCache::pinned(std::int32_t block) const { return impl_->pins.at(static_cast<std::size_t>(block)) > 0; }

std::int32_t PrefixCache::cached_children(std::int32_t block) const {
  return impl_->cached_children.at(static_cast<std::size_t>(block));
}

}  // namespace kvsim::serve
