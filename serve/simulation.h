#pragma once
// The timed simulation's state, shared by its source files (simulator.cpp: set-up, arrivals and
// routing; simulation_admit.cpp: admission, materialisation and the tiers; simulation_step.cpp:
// batched steps). Internal to serve/.
#include <array>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <vector>

#include "core/event_queue.h"
#include "serve/sim_metrics.h"
#include "serve/simulator.h"

namespace kvsim::serve::detail {

// Among events at one time: arrivals first (so a step sees every request that came at its start),
// then step ends, then wake-ups and kicks.
constexpr int kArrive = 0, kStepEnd = 1, kWake = 2;
constexpr double kInf = std::numeric_limits<double>::infinity();

struct Tier {
  std::unique_ptr<PrefixCache> cache;  // null: the tier is absent
  double capacity = 0, bytes = 0;      // bytes
  double link_free_ms = 0;             // loads into HBM queue on the tier's link
};

// A running request.
struct Seq {
  std::int32_t req = 0;
  double ready_ms = 0, last_token_ms = 0;
  std::vector<std::pair<std::int64_t, std::int64_t>> work;  // (first position, tokens) to compute
  std::size_t seg = 0;
  std::int64_t seg_done = 0, prefill_left = 0, generated = 0, output = 0, ctx = 0;
  std::vector<std::int32_t> fresh;  // blocks entering HBM when the prefill ends
  double output_bytes = 0;          // reserved for the generated tokens
  std::int64_t chunk = 0;           // prefill tokens in the current step
  bool decoding = false;            // in the current step as a decode
};

struct Instance {
  std::array<Tier, kTiers> tiers;
  std::deque<std::int32_t> waiting;
  std::vector<Seq> running;  // in admission order
  double private_bytes = 0;  // reserved for running requests, outside the prefix cache
  double pinned_bytes = 0;   // cached blocks held by running requests
  bool busy = false;         // a step is under way, or a kick is scheduled
};

class Simulation {
 public:
  Simulation(const BlockTree& tree, const SimOptions& o);
  SimResult run();

 private:
  double bytes(std::int32_t b) const { return block_bytes_[static_cast<std::size_t>(b)]; }
  // KV bytes of `tokens` tokens after compression, rounded up to whole pages.
  double paged_bytes(std::int64_t tokens) const;
  std::int64_t tick() { return ++tick_; }
  // Arrivals count from the trace's first, scaled.
  double arrival_ms(std::int32_t req) const {
    return (trace_.requests[static_cast<std::size_t>(req)].arrival_ms - trace_.requests.front().arrival_ms) /
           o_.time_scale;
  }
  void arrive(std::int32_t req);
  std::size_t route(const ServeRequest& r);
  void kick(std::size_t i);
  void start_step(std::size_t i);
  void end_step(std::size_t i, double ms);
  bool admit(Instance& in, std::int32_t req);
  std::vector<BlockState> block_states(const Instance& in, const ServeRequest& r) const;
  void reserve_loads(Instance& in, const ServeRequest& r, const std::vector<BlockState>& st,
                     const MaterializePlan& plan, Seq& s);
  void evict_hbm(Instance& in, double need);
  void demote(Instance& in, int tier, std::int32_t block);
  double chunk_ms(const Seq& s, std::int64_t tokens) const;
  void advance_chunk(Seq& s);
  void finish_prefill(Instance& in, Seq& s);
  void finish(Instance& in, Seq& s);
  void check_accounting() const;
  LoadReport load_report() const;

  const BlockTree& tree_;
  const RequestTrace& trace_;
  SimOptions o_;
  double bpt_;                       // KV bytes per token, after compression
  std::vector<double> block_bytes_;  // [block] its KV bytes, compressed and paged
  MaterializeCosts costs_;
  EventQueue<double> q_;
  std::vector<Instance> inst_;
  std::int64_t tick_ = 0;
  std::size_t next_rr_ = 0;
  SimResult res_;
  MetricSamples samples_;
  double last_done_ms_ = 0;
  std::vector<double> ttft_by_req_;  // [request] its TTFT (-1: rejected)
};

}  // namespace kvsim::serve::detail
