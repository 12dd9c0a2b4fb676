#pragma once
// Teacher-forced replay of one request of a kvtrace against many (policy, budget) configs at
// once. Each layer is read once; the full attention of the evaluation queries is computed once
// and shared by every config, which then only pays for the tokens it changes.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvcache/budget.h"
#include "kvcache/config.h"
#include "policies/policy.h"
#include "traces/trace_reader.h"

namespace kvsim {

namespace kvcache {
class CacheSignals;
}

struct ConfigResult {
  std::int64_t budget_tokens = 0;  // per (layer, KV head), before per-layer/head reallocation
  std::int64_t rows = 0;           // (layer, query head, evaluation query) rows
  double mean_recall = 0, mean_kl = 0, p95_kl = 0, mean_err = 0, p95_err = 0;
  double mean_out_sq = 0;  // mean squared absolute output error over the rows (layer_out_sq's)
  std::vector<double> layer_recall, layer_kl, layer_err;  // per-layer means
  std::vector<double> layer_p95_kl, layer_p95_err;        // per-layer tails
  std::vector<std::vector<double>> head_kl;               // [layer][query head] mean KL
  // Per-layer mean squared absolute output error |o - o'|^2: what the offline estimate weighs.
  std::vector<double> layer_out_sq;
  double kept_fraction = 1.0;   // kept / cached K/V entries at the compression point (per-query-head copies count)
  double compressed_bytes = 0;  // K/V + policy state right after compression
  double budget_bytes = 0;      // budget x full fp16 bytes at the compression point
  double peak_bytes = 0, final_bytes = 0;
  // The most the cache held at any step from the compression point on (a joining token
  // included): what peak semantics holds within budget_bytes.
  double decode_peak_bytes = 0;
  double host_bytes = 0;  // peak host-side copies of recoverable tiers (not in the device bytes)
  // Share of (layer, entry) plans whose codec could not hold every token, so the policy kept the
  // sinks and most recent tokens by position instead of by its rule (HeadPlan::position_fallback).
  double position_fallback = 0;
  double footprint = 0;         // bytes x token steps over the whole request
  std::uint64_t keep_hash = 0;  // FNV-1a of every keep mask: golden tests compare these
  // With Replayer::record_keep_sets: the tokens each entry holds right after compression,
  // [layer][entry] (what live verify reports as LiveConfigResult::kept).
  std::vector<std::vector<std::vector<std::int32_t>>> kept;
  // With Replayer::record_steps: per layer and evaluation row (a decode step), the squared
  // absolute output error |o - o'|^2 averaged over the query heads; layer_out_sq is its mean over
  // the rows. The per-step offline estimate weighs these as est_kl weighs layer_out_sq.
  std::vector<std::vector<double>> step_out_sq;
};

struct RequestResult {
  std::string request;
  std::int64_t tokens = 0, compression_point = 0, eval_queries = 0;
  std::vector<std::int64_t> eval_positions;  // [eval_queries] the token each evaluation row's query belongs to
  std::vector<ConfigResult> configs;         // same order as the configs given
  // Where the time went (wall seconds), and the floating-point work of the shared attention.
  double read_seconds = 0, attention_seconds = 0, config_seconds = 0;
  double attention_flops = 0;
};

class Replayer {
 public:
  // compress_every > 0: the policy also cuts the cache back to its budget at every this many
  // prompt tokens where it exceeds it (kvcache/config.h compression_cuts), not only at the end.
  // `rule`: when each config's byte budget holds (kvcache/budget.h BudgetRule).
  Replayer(const TraceReader& reader, ReplayMode mode, std::vector<ReplayConfig> configs,
           std::int64_t compress_every = 0, BudgetRule rule = {});
  RequestResult replay(const std::string& request_id) const;
  void record_keep_sets(bool on) { record_keep_sets_ = on; }
  void record_steps(bool on) { record_steps_ = on; }  // fill ConfigResult::step_out_sq
  const std::vector<ReplayConfig>& configs() const { return configs_; }

 private:
  // Policies that select across layers (Policy::selects_across_layers) get their selection from
  // a pass over every layer's signals first (layer_signals(l) loads layer l).
  void select_across_layers(
      std::vector<ConfigBudget>& budgets, std::int64_t c,
      const std::function<std::unique_ptr<const kvcache::CacheSignals>(int)>& layer_signals) const;

  const TraceReader& reader_;
  ReplayMode mode_;
  std::vector<ReplayConfig> configs_;
  std::int64_t compress_every_ = 0;
  BudgetRule rule_;
  bool record_keep_sets_ = false;
  bool record_steps_ = false;
};

}  // namespace kvsim
