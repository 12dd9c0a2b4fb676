#include "serve/simulator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>

#include "core/error.h"
#include "serve/simulation.h"

namespace kvsim::serve {

namespace detail {

Simulation::Simulation(const BlockTree& tree, const SimOptions& o)
    : tree_(tree),
      trace_(tree.trace()),
      o_(o),
      bpt_(o.profile.kv_bytes_per_token * o.kv_ratio),
      inst_(static_cast<std::size_t>(o.instances)) {
  for (const std::int64_t t : trace_.tokens) block_bytes_.push_back(paged_bytes(t));
  costs_.prefill = o.profile.prefill;
  costs_.links[1] = {o.dram.gbps, o.dram.latency_ms};
  costs_.links[2] = {o.ssd.gbps, o.ssd.latency_ms};
  costs_.transitions = o.transitions;
  costs_.transition_diff = o.transition_diff;
  const std::array<double, kTiers> capacity = {o.hbm_gb * 1e9, o.dram.capacity_gb * 1e9, o.ssd.capacity_gb * 1e9};
  for (Instance& in : inst_)
    for (int t = 0; t < kTiers; ++t) {
      if (capacity[static_cast<std::size_t>(t)] <= 0) continue;
      EvictionOptions e;
      e.kind = o.eviction;
      e.slru_protected = o.slru_protected;
      e.cost = o.profile.prefill;
      e.load_ms_per_token = t == 0 ? 0.0 : bpt_ / (costs_.links[static_cast<std::size_t>(t)].gbps * 1e6);
      for (int below = t + 1; below < kTiers; ++below)  // evictions demote to the next present tier
        if (capacity[static_cast<std::size_t>(below)] > 0) {
          e.demoted_load_ms_per_token = bpt_ / (costs_.links[static_cast<std::size_t>(below)].gbps * 1e6);
          break;
        }
      Tier& tier = in.tiers[static_cast<std::size_t>(t)];
      // The simulation keeps bytes; the block capacity only sizes SLRU's protected segment.
      const auto blocks =
          static_cast<std::int64_t>(capacity[static_cast<std::size_t>(t)] / paged_bytes(trace_.nominal_block_tokens()));
      tier.cache = std::make_unique<PrefixCache>(tree, std::max<std::int64_t>(1, blocks), e);
      tier.capacity = capacity[static_cast<std::size_t>(t)];
    }
}

double Simulation::paged_bytes(std::int64_t tokens) const {
  const auto page = static_cast<double>(o_.kv_page_tokens);
  return std::ceil(o_.kv_ratio * static_cast<double>(tokens) / page) * page * o_.profile.kv_bytes_per_token;
}

SimResult Simulation::run() {
  const auto t0 = std::chrono::steady_clock::now();
  res_.requests = static_cast<std::int64_t>(trace_.requests.size());
  ttft_by_req_.assign(trace_.requests.size(), -1.0);
  for (std::size_t r = 0; r < trace_.requests.size(); ++r)
    q_.schedule(arrival_ms(static_cast<std::int32_t>(r)), kArrive, [this, r] { arrive(static_cast<std::int32_t>(r)); });
  std::int64_t events = 0;
  while (q_.step())
    if (o_.progress && ++events % 65536 == 0) o_.progress(q_.now(), res_.completed + res_.rejected, res_.requests);
  if (o_.progress) o_.progress(q_.now(), res_.completed + res_.rejected, res_.requests);
  res_.makespan_s = last_done_ms_ / 1e3;
  if (res_.makespan_s > 0) {
    res_.throughput_tokens_s = static_cast<double>(res_.output_tokens) / res_.makespan_s;
    res_.throughput_requests_s = static_cast<double>(res_.completed) / res_.makespan_s;
  }
  res_.ttft_ms = samples_.ttft.percentiles();
  res_.ttft_centiles_ms = samples_.ttft.centiles();
  res_.tbt_ms = samples_.tbt.percentiles();
  res_.queue_ms = samples_.queue.percentiles();
  for (const Instance& in : inst_)
    for (const Tier& t : in.tiers)
      if (t.cache) res_.evictions += t.cache->evictions();
  check_accounting();
  res_.load = load_report();
  res_.hbm_blocks = o_.hbm_gb * 1e9 / (bpt_ * static_cast<double>(trace_.nominal_block_tokens()));
  res_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res_;
}

LoadReport Simulation::load_report() const {
  LoadReport l = res_.load;
  l.arrival_span_ms = arrival_ms(static_cast<std::int32_t>(trace_.requests.size() - 1));
  l.suggested_instances = o_.instances;
  // Requests in arrival order (the trace's is by timestamp); a quarter's mean over its served ones.
  auto quarter_mean = [&](std::size_t from, std::size_t to) {
    double sum = 0, n = 0;
    for (std::size_t r = from; r < to; ++r)
      if (ttft_by_req_[r] >= 0) sum += ttft_by_req_[r], ++n;
    return n > 0 ? sum / n : 0.0;
  };
  const std::size_t n = ttft_by_req_.size(), q = std::max<std::size_t>(1, n / 4);
  l.ttft_first_ms = quarter_mean(0, q);
  l.ttft_last_ms = quarter_mean(n - q, n);
  if (l.arrival_span_ms <= 0) return l;  // one burst: no rate to hold
  l.offered_load = l.busy_ms / (o_.instances * l.arrival_span_ms);
  const bool growing = l.ttft_last_ms > std::max(2 * l.ttft_first_ms, 0.1 * l.arrival_span_ms);
  l.overloaded = l.offered_load > 1 || growing;
  if (l.overloaded)
    l.suggested_instances =
        std::max(o_.instances + 1, static_cast<int>(std::ceil(l.busy_ms / (0.8 * l.arrival_span_ms))));
  return l;
}

// Once every request is done, nothing may stay reserved or pinned, and each tier's byte count must
// equal its cached blocks' bytes: a drift would have skewed every capacity decision.
void Simulation::check_accounting() const {
  for (std::size_t i = 0; i < inst_.size(); ++i) {
    const Instance& in = inst_[i];
    const double tolerance = 1e-6 * std::max(1.0, in.tiers[0].capacity);
    bool ok = in.running.empty() && in.waiting.empty() && std::abs(in.private_bytes) <= tolerance &&
              std::abs(in.pinned_bytes) <= tolerance;
    for (const Tier& t : in.tiers) {
      if (!t.cache) continue;
      double held = 0;
      for (std::size_t b = 0; b < trace_.blocks(); ++b) {
        const auto block = static_cast<std::int32_t>(b);
        if (t.cache->cached(block)) held += bytes(block);
        ok = ok && !t.cache->pinned(block);
      }
      ok = ok && std::abs(held - t.bytes) <= tolerance && t.bytes <= t.capacity + tolerance;
    }
    if (!ok)
      throw std::logic_error("serve simulation: instance " + std::to_string(i) +
                             "'s memory accounting drifted (reserved " + std::to_string(in.private_bytes) +
                             " B, pinned " + std::to_string(in.pinned_bytes) + " B)");
  }
}

void Simulation::arrive(std::int32_t req) {
  const std::size_t i = route(trace_.requests[static_cast<std::size_t>(req)]);
  inst_[i].waiting.push_back(req);
  kick(i);
}

// Prefix: the instance holding the longest run of the prompt's blocks in any tier (fewest queued
// requests on a tie, then the lowest index).
std::size_t Simulation::route(const ServeRequest& r) {
  const std::size_t n = inst_.size();
  auto load = [&](std::size_t i) { return inst_[i].waiting.size() + inst_[i].running.size(); };
  if (o_.route == Route::RoundRobin) return next_rr_++ % n;
  std::size_t best = 0;
  std::size_t best_run = 0;
  for (std::size_t i = 0; i < n; ++i) {
    std::size_t run = 0;
    if (o_.route == Route::Prefix)
      while (run < r.blocks.size() && std::any_of(inst_[i].tiers.begin(), inst_[i].tiers.end(), [&](const Tier& t) {
               return t.cache && t.cache->cached(r.blocks[run]);
             }))
        ++run;
    if (i == 0 || run > best_run || (run == best_run && load(i) < load(best))) {
      best = i;
      best_run = run;
    }
  }
  return best;
}

// Starts a step at the current time once the events already due at it have run.
void Simulation::kick(std::size_t i) {
  if (inst_[i].busy) return;
  inst_[i].busy = true;
  q_.schedule(q_.now(), kWake, [this, i] {
    inst_[i].busy = false;
    start_step(i);
  });
}

}  // namespace detail

Route parse_route(const std::string& name) {
  if (name == "prefix") return Route::Prefix;
  if (name == "round-robin") return Route::RoundRobin;
  if (name == "least-loaded") return Route::LeastLoaded;
  throw Error("router '" + name + "' is unknown; expected one of: prefix, round-robin, least-loaded");
}

std::string route_name(Route r) {
  return r == Route::Prefix ? "prefix" : r == Route::RoundRobin ? "round-robin" : "least-loaded";
}

double SimResult::hit_rate() const {
  return block_refs ? 1.0 - static_cast<double>(blocks_by_way[static_cast<int>(Way::Recompute)]) /
                                static_cast<double>(block_refs)
                    : 0.0;
}

double SimResult::share(Way w) const {
  return block_refs ? static_cast<double>(blocks_by_way[static_cast<std::size_t>(w)]) / static_cast<double>(block_refs)
                    : 0.0;
}

}  // namespace kvsim::serve

namespace kvsim::serve {

namespace {

void check_options(const BlockTree& tree, const SimOptions& o) {
  auto fail = [](const std::string& what) { throw Error("serve simulation: " + what); };
  if (tree.trace().requests.empty()) fail(tree.trace().path + ": no requests");
  if (o.instances < 1) fail("instances " + std::to_string(o.instances) + "; expected >= 1");
  if (!(o.hbm_gb > 0)) fail("HBM capacity " + std::to_string(o.hbm_gb) + " GB; expected > 0");
  for (const auto& [name, t] : {std::pair{"DRAM", o.dram}, std::pair{"SSD", o.ssd}}) {
    if (!(t.capacity_gb >= 0))
      fail(std::string(name) + " capacity " + std::to_string(t.capacity_gb) + " GB; expected >= 0");
    if (t.capacity_gb > 0 && !(t.gbps > 0))
      fail(std::string(name) + " bandwidth " + std::to_string(t.gbps) + " GB/s; expected > 0 for a tier with capacity");
    if (!(t.latency_ms >= 0))
      fail(std::string(name) + " latency " + std::to_string(t.latency_ms) + " ms; expected >= 0");
  }
  if (o.max_batch_tokens < 1) fail("max batch tokens " + std::to_string(o.max_batch_tokens) + "; expected >= 1");
  if (o.max_seqs < 1) fail("max sequences " + std::to_string(o.max_seqs) + "; expected >= 1");
  if (o.kv_page_tokens < 1) fail("KV page " + std::to_string(o.kv_page_tokens) + " tokens; expected >= 1");
  if (!(o.kv_ratio > 0)) fail("KV ratio " + std::to_string(o.kv_ratio) + "; expected > 0");
  if (!(o.transition_diff > 0 && o.transition_diff <= 1))
    fail("transition diff " + std::to_string(o.transition_diff) + "; expected a share in (0, 1]");
  if (!(o.time_scale > 0)) fail("time scale " + std::to_string(o.time_scale) + "; expected > 0");
  if (!(o.profile.kv_bytes_per_token > 0)) fail("profile '" + o.profile.name + "' has no KV bytes per token");
}

}  // namespace

SimResult simulate(const BlockTree& tree, const SimOptions& options) {
  check_options(tree, options);
  return detail::Simulation(tree, options).run();
}

}  // namespace kvsim::serve
