#pragma once
// Deterministic synthetic kvtrace generator. Attention patterns are not written as weights: they
// are built into pre-RoPE keys and queries so that they emerge from q·k after RoPE (sinks,
// recency, heavy hitters, retrieval heads finding a planted needle, entropy falling with depth,
// GQA groups with mixed roles). README.md, "Synthetic traces"; tests/test_synth.cpp checks each.
#include <cstdint>
#include <string>
#include <vector>

#include "traces/trace_schema.h"

namespace kvsim {

class TraceWriter;

enum class HeadRole : std::int8_t { Broad = 0, Local = 1, Heavy = 2, Retrieval = 3 };
const char* head_role_name(HeadRole r);

struct SynthConfig {
  ModelGeometry geometry = smollm2_135m_geometry();
  std::uint64_t seed = 1;
  int n_requests = 2;
  int system_tokens = 32;
  int context_tokens = 1024;  // documents, the needle is planted inside
  int question_tokens = 24;
  int generated_tokens = 32;
  int needle_tokens = 16;
  double needle_depth = -1.0;  // needle start as a fraction of the context; < 0: request r of n
                               // at (r + 0.5) / n, so a trace covers several depths
  bool all_queries = true;     // false: only the last `query_window` context tokens + question + generated
  int query_window = 32;
  bool repeat_pass = false;  // also write a synthetic KVzip reconstruction pass (needs all_queries): one
                             // chunk repeating the context, each row with its context token's query and key
  int ref_topk = 16;
  double heavy_fraction = 0.03;           // of context tokens
  double retrieval_head_fraction = 0.15;  // of heads in layers past the first third
  double sink_logit = 8.0;
  double heavy_logit = 4.5;
  double needle_logit = 9.0;
  double local_logit = 6.0;
  double noise = 0.7;            // std of the isotropic noise in keys and queries
  double min_layer_scale = 0.4;  // query scale of layer 0 (broad attention)
  double max_layer_scale = 1.4;  // query scale of the last layer (sharp attention)

  // Empty when usable; otherwise one message per bad field.
  std::vector<std::string> problems() const;
  std::string to_json() const;
};

// The ground truth a generated request was built around (what tests and oracles check against).
struct SynthPlan {
  RequestHeader header;
  std::vector<std::int32_t> heavy_hitters;  // token indices, increasing
  std::vector<HeadRole> roles;              // [n_layers * n_q_heads]
};

struct SynthLayer {
  std::vector<float> k, v, q;  // post-RoPE, [T, Hkv, d], [T, Hkv, d], [Tq, Hq, d]
};

SynthPlan plan_synth_request(const SynthConfig& cfg, int request);
SynthLayer synth_layer(const SynthConfig& cfg, const SynthPlan& plan, int request, int layer);
ReferenceDistribution synth_reference(const SynthConfig& cfg, const SynthPlan& plan, int request);

// Writes all requests of `cfg` through `writer` (a layer at a time: memory stays one layer).
void write_synth_trace(const SynthConfig& cfg, TraceWriter& writer);
CaptureInfo synth_capture_info(const SynthConfig& cfg);

}  // namespace kvsim
