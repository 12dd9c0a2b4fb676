#pragma once
// What the trainers learn from: per (request, layer, KV head) at the compression point, every
// cached token's features (learned/features.h) and a label from a labelling policy's scores
// (oracle_golden's golden eviction label for foresight). Collected through an ordinary replay, so
// the signals are exactly the ones the learned policy will see.
#include <cstdint>
#include <string>
#include <vector>

#include "kvcache/config.h"
#include "traces/trace_reader.h"

namespace kvsim::train {

struct HeadSample {
  int request = 0;  // index into the trainer's request list
  int layer = 0, kv_head = 0;
  std::int64_t tokens = 0;
  std::vector<float> x;      // [tokens, kFeatureCount], raw (not standardised)
  std::vector<float> label;  // [tokens], higher = keep
};

// Samples of every layer and KV head of one request; `labeler` is a registry spec of a scoring
// policy (e.g. "oracle_golden"). `request` is stored in every sample.
std::vector<HeadSample> collect_head_samples(const TraceReader& reader, const std::string& request_id, ReplayMode mode,
                                             const std::string& labeler, int request);

}  // namespace kvsim::train
