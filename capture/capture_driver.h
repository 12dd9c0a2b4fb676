#pragma once
// `kvsim capture`: runs a GGUF model over requests and records a kvtrace: post-RoPE K/V of
// every token and Q of the selected positions for every layer, segments, and the reference
// next-token distribution (top-k log-probs + logsumexp) for the question and answer tokens.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/engine.h"
#include "prompts/request_file.h"

namespace kvsim {

struct CaptureOptions {
  std::string model_path, out_path;
  int max_new = 32;  // greedy tokens when a request has no answer
  int min_new = 0;   // ... of which this many before an end-of-generation token may be chosen
  int ref_topk = 16;
  bool all_queries = false;  // false: last `query_window` context tokens + question + answer
  int query_window = 64;
  int prefill_chunk = 256;  // tokens per prefill forward pass
  bool overwrite = false;
  // Continue a capture that was stopped: OUT.partial keeps its committed requests (a request left
  // half-written is captured again) and the missing ones follow, with the same configuration.
  bool resume = false;
  bool repeat_pass = false;  // also record KVzip's context-reconstruction pass (capture/repeat_pass.h)
  // Also record each chunk of a chunked request computed alone (prompts/chunk_alone.h,
  // docs/chunk-states.md); every request must be chunked.
  bool chunk_states = false;
  WeightFormat weights = WeightFormat::Quantized;  // the CPU engine's
  Device device = Device::Cpu;
};

struct CaptureSummary {
  std::int64_t requests = 0, tokens = 0;
  double seconds = 0;
};

// Builds the engine for the opened model file; the default, make_engine(opts.device, opts.weights).
// The tests capture on the backend engine over the CPU reference (the GPU's stand-in) this way.
using EngineFactory = std::function<std::unique_ptr<Engine>(const GgufFile&)>;
CaptureSummary run_capture(const std::vector<CaptureRequest>& requests, const CaptureOptions& opts,
                           const EngineFactory& make = {});

}  // namespace kvsim
