#pragma once
// Teacher-forced replay of one request of a kvtrace against many (policy, budget) configs at
// once. Each layer is read once; the full attention of the evaluation queries is computed once
// and shared by every config, which then only pays for the tokens it changes.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "policies/policy.h"
#include "traces/trace_reader.h"

namespace kvsim {

// QueryAware: compress at the end of the prompt (the question is in the observation window,
// as LongBench-style SnapKV). QueryAgnostic: compress the context before the question arrives,
// then evaluate the question and answer on the compressed cache (KVzip / kvpress).
enum class ReplayMode { QueryAware, QueryAgnostic };
const char* mode_name(ReplayMode m);
ReplayMode parse_mode(const std::string& s);

struct ReplayConfig {
  std::string policy;  // registry name
  std::string params;  // canonical parameters
  std::shared_ptr<const Policy> impl;
  double budget = 1.0;  // fraction of the full fp16 KV bytes at the compression point
  std::string label() const { return params.empty() ? policy : policy + ":" + params; }
};

struct ConfigResult {
  std::int64_t budget_tokens = 0;  // per (layer, KV head), before per-layer/head reallocation
  std::int64_t rows = 0;           // (layer, query head, evaluation query) rows
  double mean_recall = 0, mean_kl = 0, p95_kl = 0, mean_err = 0, p95_err = 0;
  std::vector<double> layer_recall, layer_kl, layer_err;  // per-layer means
  std::vector<double> layer_p95_kl, layer_p95_err;        // per-layer tails
  double kept_fraction = 1.0;      // kept / cached K/V entries at the compression point (per-query-head copies count)
  double compressed_bytes = 0;     // K/V + policy state right after compression
  double budget_bytes = 0;         // budget x full fp16 bytes at the compression point
  double peak_bytes = 0, final_bytes = 0;
  double host_bytes = 0;           // peak host-side copies of recoverable tiers (not in the device bytes)
  double footprint = 0;            // bytes x token steps over the whole request
  std::uint64_t keep_hash = 0;     // FNV-1a of every keep mask: golden tests compare these
};

struct RequestResult {
  std::string request;
  std::int64_t tokens = 0, compression_point = 0, eval_queries = 0;
  std::vector<ConfigResult> configs;  // same order as the configs given
  // Where the time went (wall seconds), and the floating-point work of the shared attention.
  double read_seconds = 0, attention_seconds = 0, config_seconds = 0;
  double attention_flops = 0;
};

class Replayer {
 public:
  // prefill_chunk > 0: the prompt is prefilled in chunks of that many tokens and compressed to
  // the budget at every chunk boundary where the cache exceeds it, not only at the end.
  Replayer(const TraceReader& reader, ReplayMode mode, std::vector<ReplayConfig> configs,
           std::int64_t prefill_chunk = 0);
  RequestResult replay(const std::string& request_id) const;
  const std::vector<ReplayConfig>& configs() const { return configs_; }

 private:
  const TraceReader& reader_;
  ReplayMode mode_;
  std::vector<ReplayConfig> configs_;
  std::int64_t prefill_chunk_ = 0;
};

}  // namespace kvsim
