// Admission of a waiting request: where its blocks are, the cheapest way to materialise them, HBM
// room made by demoting leaves down the tiers, and the loads queued on the tiers' links.
#include <algorithm>

#include "serve/simulation.h"

namespace kvsim::serve::detail {

std::vector<BlockState> Simulation::block_states(const Instance& in, const ServeRequest& r) const {
  std::vector<BlockState> st(r.blocks.size());
  for (std::size_t i = 0; i < r.blocks.size(); ++i) {
    BlockState& s = st[i];
    const std::int32_t b = r.blocks[i];
    s.start = trace_.start[static_cast<std::size_t>(b)];
    s.tokens = trace_.tokens[static_cast<std::size_t>(b)];
    s.bytes = bytes(b);
    for (int t = 0; t < kTiers; ++t) {
      const Tier& tier = in.tiers[static_cast<std::size_t>(t)];
      if (!tier.cache) continue;
      s.in[static_cast<std::size_t>(t)] = tier.cache->cached(b);
      // A sibling: another cached child of the same parent (the tier counts its cached children,
      // so the children are searched only where one exists).
      if (o_.transitions && s.sibling_tier < 0 && i > 0 &&
          tier.cache->cached_children(r.blocks[i - 1]) > (s.in[static_cast<std::size_t>(t)] ? 1 : 0)) {
        s.sibling = tree_.find_child(r.blocks[i - 1], [&](std::int32_t c) { return c != b && tier.cache->cached(c); });
        s.sibling_tier = t;
        s.sibling_bytes = bytes(s.sibling);
      }
    }
  }
  return st;
}

// Makes room in HBM for `need` more bytes next to the pinned and reserved ones: unpinned leaves
// go, in the policy's order, down to DRAM (then SSD).
void Simulation::evict_hbm(Instance& in, double need) {
  Tier& hbm = in.tiers[0];
  while (hbm.bytes + in.private_bytes + need > hbm.capacity) {
    const std::int32_t v = hbm.cache->evict(tick());
    if (v < 0) return;  // the caller checked that the unpinned bytes suffice
    hbm.bytes -= bytes(v);
    demote(in, 1, v);
  }
}

// Writes an evicted block back to `tier` unless it already holds a copy; the tier's own victims
// go one tier down, and SSD's are dropped.
void Simulation::demote(Instance& in, int tier, std::int32_t block) {
  if (tier >= kTiers) return;
  Tier& t = in.tiers[static_cast<std::size_t>(tier)];
  if (!t.cache) {
    demote(in, tier + 1, block);  // a missing DRAM tier passes blocks on to SSD
    return;
  }
  const double b = bytes(block);
  if (t.cache->cached(block) || b > t.capacity) return;
  while (t.bytes + b > t.capacity) {
    const std::int32_t v = t.cache->evict(tick());
    if (v < 0) return;
    t.bytes -= bytes(v);
    demote(in, tier + 1, v);
  }
  t.cache->insert(block, tick());
  t.bytes += b;
  res_.written_gb[static_cast<std::size_t>(tier)] += b / 1e9;
}

// Queues the plan's loads on the tiers' links (a run of blocks from one tier is one transfer) and
// lays out the prefill work; the request is ready when its last transfer lands.
void Simulation::reserve_loads(Instance& in, const ServeRequest& r, const std::vector<BlockState>& st,
                               const MaterializePlan& plan, Seq& s) {
  const double now = q_.now();
  s.ready_ms = now;
  auto transfer = [&](int tier, double b) {
    Tier& t = in.tiers[static_cast<std::size_t>(tier)];
    t.link_free_ms = std::max(t.link_free_ms, now) + costs_.links[static_cast<std::size_t>(tier)].ms(b);
    s.ready_ms = std::max(s.ready_ms, t.link_free_ms);
    res_.loaded_gb[static_cast<std::size_t>(tier)] += b / 1e9;
  };
  auto add_work = [&](std::int64_t start, std::int64_t tokens) {
    if (!s.work.empty() && s.work.back().first + s.work.back().second == start)
      s.work.back().second += tokens;
    else
      s.work.emplace_back(start, tokens);
  };
  for (std::size_t i = 0; i < st.size();) {
    const Way w = plan.way[i];
    const std::int32_t b = r.blocks[i];
    ++res_.blocks_by_way[static_cast<std::size_t>(w)];
    if (w == Way::LoadDram || w == Way::LoadSsd) {
      const int tier = w == Way::LoadDram ? 1 : 2;
      double run = 0;
      std::size_t j = i;
      for (; j < st.size() && plan.way[j] == w; ++j) {
        run += bytes(r.blocks[j]);
        in.tiers[static_cast<std::size_t>(tier)].cache->touch(r.blocks[j], tick());
        if (j > i) ++res_.blocks_by_way[static_cast<std::size_t>(w)];
      }
      transfer(tier, run);
      i = j;
      continue;
    }
    if (w == Way::Hbm) in.tiers[0].cache->touch(b, tick());
    if (w == Way::Recompute) add_work(st[i].start, st[i].tokens);
    if (w == Way::Transition) {
      in.tiers[static_cast<std::size_t>(st[i].sibling_tier)].cache->touch(st[i].sibling, tick());
      if (st[i].sibling_tier > 0) transfer(st[i].sibling_tier, st[i].sibling_bytes);
      const std::int64_t k = transition_tokens(st[i].tokens, o_.transition_diff);
      add_work(st[i].start + st[i].tokens - k, k);
    }
    ++i;
  }
  if (r.question_tokens > 0) add_work(r.input_tokens - r.question_tokens, r.question_tokens);  // never cached
  if (s.work.empty()) s.work.emplace_back(r.input_tokens - 1, 1);  // the last token, for its logits
  for (const auto& [start, tokens] : s.work) s.prefill_left += tokens;
  res_.prefill_tokens += s.prefill_left;
}

// Admits `req` if HBM can hold its blocks and its output next to what running requests hold.
// False leaves it waiting (first come, first served). A request larger than HBM itself is
// rejected.
bool Simulation::admit(Instance& in, std::int32_t req) {
  const ServeRequest& r = trace_.requests[static_cast<std::size_t>(req)];
  Tier& hbm = in.tiers[0];
  const std::vector<BlockState> st = block_states(in, r);
  const double output_bytes = paged_bytes(std::max<std::int64_t>(1, r.output_tokens));
  double need = output_bytes, hit_bytes = 0, new_pins = 0;
  for (std::size_t i = 0; i < st.size(); ++i) {
    const double b = bytes(r.blocks[i]);
    if (!st[i].in[0])
      need += b;
    else {
      hit_bytes += b;
      if (!hbm.cache->pinned(r.blocks[i])) new_pins += b;
    }
  }
  if (need + hit_bytes > hbm.capacity) {
    ++res_.rejected;
    return true;  // never fits: dropped, and the queue moves on
  }
  if (hbm.capacity - in.private_bytes - in.pinned_bytes - new_pins < need) return false;
  const MaterializePlan plan = plan_materialization(st, costs_);
  // A transition from a sibling in HBM holds that sibling too while room is made.
  for (std::size_t i = 0; i < st.size(); ++i)
    if (plan.way[i] == Way::Transition && st[i].sibling_tier == 0 && !hbm.cache->pinned(st[i].sibling))
      new_pins += st[i].sibling_bytes;
  if (hbm.capacity - in.private_bytes - in.pinned_bytes - new_pins < need) return false;
  res_.planned_ms += plan.ms;
  res_.recompute_only_ms += plan.recompute_only_ms;
  res_.load_only_ms += plan.load_only_ms;
  res_.block_refs += static_cast<std::int64_t>(st.size());
  for (std::size_t i = 0; i < st.size(); ++i)
    if (st[i].in[0] && hbm.cache->pin(r.blocks[i])) in.pinned_bytes += bytes(r.blocks[i]);
  // The blocks to load and the transitions' siblings stay in their tiers while HBM's victims come
  // down.
  std::vector<std::pair<PrefixCache*, std::int32_t>> sources;
  for (std::size_t i = 0; i < st.size(); ++i) {
    const Way w = plan.way[i];
    if (w == Way::LoadDram || w == Way::LoadSsd)
      sources.emplace_back(in.tiers[w == Way::LoadDram ? 1 : 2].cache.get(), r.blocks[i]);
    if (w == Way::Transition)
      sources.emplace_back(in.tiers[static_cast<std::size_t>(st[i].sibling_tier)].cache.get(), st[i].sibling);
  }
  for (const auto& [c, b] : sources) c->pin(b);
  evict_hbm(in, need);
  in.private_bytes += need;
  Seq s;
  s.req = req;
  s.output = std::max<std::int64_t>(1, r.output_tokens);
  s.output_bytes = output_bytes;
  s.ctx = r.input_tokens;
  for (std::size_t i = 0; i < st.size(); ++i)
    if (!st[i].in[0]) s.fresh.push_back(r.blocks[i]);
  reserve_loads(in, r, st, plan, s);
  for (const auto& [c, b] : sources) c->unpin(b);
  samples_.queue.add(q_.now() - arrival_ms(req));
  in.running.push_back(std::move(s));
  return true;
}

}  // namespace kvsim::serve::detail
