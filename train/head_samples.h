#pragma once
// What the trainers learn from: per (request, layer, KV head) at the compression point (and, for
// ForesightKV's per-block labels, at every decode block), every cached token's features (learned/features.h) and a
// label from a labelling policy's scores (oracle_golden's golden eviction label for foresight). Collected through an
// ordinary replay, so the signals are exactly the ones the learned policy will see.
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
  // Relative squared error of the evaluation queries' attention output (over the cached tokens)
  // when this head keeps only its streaming window instead of everything: rlkv's per-head proxy.
  double streaming_error = 0;
  // With SampleOptions::output_rows: up to that many evaluation rows per query head of the group
  // (evenly spaced), their attention over the cached tokens [group * rows, tokens], and the
  // head's values [tokens, head_dim] (sigmoid_gate's loss).
  std::int64_t rows = 0;  // per query head
  std::vector<float> attn, values;
  // The tokens seen when it was recorded: the compression point, or (SampleOptions::decode_block)
  // the start of a decode block.
  std::int64_t point = 0;
};

// The streaming window the per-head proxy assumes (rlkv's defaults: RLKV's s16r64).
struct StreamingWindow {
  std::int64_t sinks = 16, recent = 64;
};

struct SampleOptions {
  std::string labeler = "oracle_golden";  // a registry spec of a scoring policy
  StreamingWindow window;
  std::int64_t output_rows = 0;  // > 0: keep attention rows and values (HeadSample::attn)
  // > 0: also record at the start of every decode block of this many tokens (ForesightKV's
  // supervised stage). The replay then follows the labeller's own evictions under peak semantics
  // at `trajectory_budget`, re-applied every block, and each block's labels see only the queries
  // still to come. Needs every decode query in the trace.
  std::int64_t decode_block = 0;
  double trajectory_budget = 0.25;
};

// Samples of every layer and KV head of one request; `request` is stored in every sample.
std::vector<HeadSample> collect_head_samples(const TraceReader& reader, const std::string& request_id, ReplayMode mode,
                                             int request, const SampleOptions& o = {});

// The streaming_error of KV head kv over its signals (needs the evaluation queries' attention).
double streaming_error(const LayerSignals& s, int kv, const StreamingWindow& window);

}  // namespace kvsim::train
