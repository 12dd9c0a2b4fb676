#pragma once
// The timed serving simulation (docs/serving.md): requests of a Mooncake trace arrive at their
// timestamps, are routed to instances, wait for HBM, have their prompt state materialised by the
// cheapest way (materialize.h: HBM hits, loads from host DRAM / SSD, recompute, transitions), and
// run under continuous batching with chunked prefill. Every step's time comes from a cost profile.
// Each instance holds a prefix cache per tier: HBM blocks evicted go down to DRAM, DRAM's to SSD.
// Driven by the event core (core/event_queue.h); no random draws, so a run is a function of its
// inputs.
#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "serve/block_tree.h"
#include "serve/materialize.h"
#include "serve/prefix_cache.h"
#include "serve/profile.h"

namespace kvsim::serve {

enum class Route { Prefix, RoundRobin, LeastLoaded };
Route parse_route(const std::string& name);  // "prefix", "round-robin", "least-loaded"
std::string route_name(Route r);

struct TierSpec {
  double capacity_gb = 0;  // 0: the tier is absent
  double gbps = 0;         // into HBM
  double latency_ms = 0;   // per transfer
};

struct SimOptions {
  ServeProfile profile;
  int instances = 1;
  double hbm_gb = 16;  // KV space per instance (after weights and activations)
  TierSpec dram, ssd;  // per instance
  Eviction eviction = Eviction::Lru;
  double slru_protected = 0.8;
  std::int64_t max_batch_tokens = 2048;  // per step: decode tokens + prefill chunks
  int max_seqs = 256;                    // running sequences per instance
  double kv_ratio = 1;                   // KV bytes per token relative to the profile's (compression)
  // Each head's share of a block (and of the output) rounds up to pages of this many tokens, as a
  // paged allocator holds ragged per-head caches.
  std::int64_t kv_page_tokens = 16;
  bool transitions = false;
  double transition_diff = 0.25;
  Route route = Route::Prefix;
  double time_scale = 1;  // arrivals at timestamp / time_scale (> 1: a higher request rate)
  // Called now and then with (simulated ms, requests finished, requests in all).
  std::function<void(double, std::int64_t, std::int64_t)> progress;
};

struct Percentiles {
  double p50 = 0, p90 = 0, p99 = 0, mean = 0;
  std::int64_t count = 0;  // samples (weights); 0: the figures mean nothing
};

// Offered load against capacity: the instances' busy time over the span of the arrivals, and the
// time to first token of the first and last quarter of arrivals, which holds any backlog (queued
// for admission or admitted and waiting for prefill) (docs/serving.md, "Overload").
struct LoadReport {
  double busy_ms = 0;                          // step time summed over instances
  double arrival_span_ms = 0;                  // first to last arrival (after --time-scale)
  double offered_load = 0;                     // busy_ms / (instances x arrival_span_ms); > 1: more work than time
  double ttft_first_ms = 0, ttft_last_ms = 0;  // mean TTFT, first and last quarter of arrivals
  bool overloaded = false;                     // offered load > 1, or TTFT grew past 2x and a tenth of the span
  // Instances whose busy time would fill 80% of the span, from this run's work (a lower bound
  // when overloaded: longer queues batch more); the run's own count when not overloaded.
  int suggested_instances = 0;
};

struct SimResult {
  std::int64_t requests = 0, completed = 0, rejected = 0;  // rejected: more KV than an instance's HBM
  std::int64_t block_refs = 0;
  std::array<std::int64_t, kWays> blocks_by_way{};       // how each block reference was materialised
  std::array<double, kTiers> loaded_gb{}, written_gb{};  // traffic into HBM per tier; write-backs per tier
  std::int64_t prefill_tokens = 0, output_tokens = 0;    // computed prefill tokens; generated tokens
  Percentiles ttft_ms, tbt_ms, queue_ms;                 // queue: arrival to admission
  std::vector<double> ttft_centiles_ms;                  // TTFT at 0, 1, ..., 100 percent (empty without samples)
  double makespan_s = 0, throughput_tokens_s = 0, throughput_requests_s = 0;
  double planned_ms = 0, recompute_only_ms = 0, load_only_ms = 0;  // the plans' estimates, summed
  std::int64_t steps = 0, evictions = 0;
  LoadReport load;
  double hbm_blocks = 0;    // what one instance's HBM holds, in trace blocks (full ones)
  double seconds = 0;       // wall time of the simulation
  double hit_rate() const;  // block references not recomputed (any tier, or a transition)
  double share(Way w) const;
};

// Throws for an empty trace, options out of range (instances, capacities, bandwidths of present
// tiers, batch limits), or a profile without KV bytes per token.
SimResult simulate(const BlockTree& tree, const SimOptions& options);

}  // namespace kvsim::serve
