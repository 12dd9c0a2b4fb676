#pragma once
// What one (policy, budget) configuration is, and when it compresses: shared by offline replay
// and live verify so that both read a config and its schedule the same way.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "policies/policy.h"

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

// The prompt positions where a policy may cut the cache before the compression point c, in
// order, ending with c itself: every `every` tokens (--compress-every; 0 or >= c: c alone).
std::vector<std::int64_t> compression_cuts(std::int64_t c, std::int64_t every);

}  // namespace kvsim
