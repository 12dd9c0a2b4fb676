#pragma once
// Live verification: the same policy objects the replay uses, applied online to the engine's KV
// cache. Per request one full-cache run is shared by every config: the prefill up to the
// compression point (saved and restored per config) and the reference continuation (greedy on
// the full cache). Each config then compresses the restored cache for real (dropped tokens
// leave it), runs teacher-forced on the reference continuation (next-token KL, top-1, perplexity)
// and, where its predictions diverge, free-running (the task score).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/engine.h"
#include "prompts/request_file.h"
#include "model/weight_matrix.h"
#include "policies/policy.h"
#include "kvcache/budget.h"
#include "kvcache/config.h"
#include "verify/chunk_reuse.h"

namespace kvsim {

class Engine;
class GgufFile;

struct VerifyOptions {
  ReplayMode mode = ReplayMode::QueryAware;
  int max_new = 16;         // reference continuation length (greedy, stops at EOS)
  int min_new = 0;          // ... but not before this many tokens (the best non-end token is taken)
  bool all_queries = true;  // record every prompt query (H2O-style scores need them)
  int query_window = 64;    // else: the last this many context tokens' queries
  int prefill_chunk = 256;  // tokens per forward pass; capture's default, so keep-sets match a trace
  // > 0: the policy also cuts the cache back to its budget every this many prompt tokens
  // (kvcache/config.h compression_cuts), as sweep --compress-every simulates.
  std::int64_t compress_every = 0;
  BudgetRule budget_rule;  // when the byte budget holds (kvcache/budget.h), as sweep --budget-semantics
  WeightFormat weights = WeightFormat::Quantized;  // the CPU engine's
  Device device = Device::Cpu;
  // Decode-time policies whose step is a rule (core/decode_rule.h: H2O, TOVA) step inside the
  // engine when it runs rules (the CUDA backend: on the GPU, no weights or rows to the host);
  // false steps every policy on the host. Both evict the same tokens.
  bool rules_in_engine = true;
  bool allow_training_requests = false;  // learned policies may run on their training prompts
  // false: teacher-forced only, no free-running generation (no task score): what a training
  // reward needs, at half the cost for configs that diverge.
  bool free_run = true;
};

struct LiveConfigResult {
  std::int64_t budget_tokens = 0;
  std::int64_t steps = 0;          // continuation predictions the compression can affect
  double mean_kl = 0, max_kl = 0;  // KL(full || compressed) of those next-token distributions
  // Per step: its KL and the token whose query gave the distribution (a cache change after that
  // token's step, at cache size n, can affect the steps whose query token is >= n).
  std::vector<double> step_kl;
  std::vector<std::int64_t> step_query;
  double top1 = 1;          // share of them whose argmax is the reference token
  double ppl = 0;           // perplexity of the reference continuation over them
  double task_score = 0;    // share of expected strings in the free generation (NaN: none)
  bool same_tokens = true;  // free generation == reference continuation
  std::string generated;
  double kept_fraction = 1;  // K/V rows after compression / rows of the full cache
  double compressed_bytes = 0, budget_bytes = 0;
  // The most the cache held at any step of the teacher-forced run from the compression point on
  // (ConfigResult::decode_peak_bytes).
  double decode_peak_bytes = 0;
  double position_fallback = 0;  // share of plan entries kept by position (ConfigResult's)
  std::int64_t final_rows = 0;   // K/V rows in the cache after the teacher-forced continuation
  // Where the decode-time policy stepped: "engine" (its rule, inside the engine), "host", or
  // "none" (a one-shot policy).
  std::string policy_steps = "none";
  double seconds = 0;
  // The kept tokens right after compression, [layer][entry] (for the agreement tests), and after
  // the teacher-forced continuation (what decode-time eviction left).
  std::vector<std::vector<std::vector<std::int32_t>>> kept, final_kept;
};

struct LiveRequestResult {
  std::string request, task;
  std::int64_t compression_point = 0, prompt_tokens = 0;
  std::vector<std::int32_t> reference;  // the full-cache continuation
  std::string reference_text;
  double reference_ppl = 0, reference_task_score = 0;
  double shared_seconds = 0;  // prefill + reference run
  std::vector<LiveConfigResult> configs;
};

class LiveVerifier {
 public:
  // `gguf` must outlive the verifier (weights may stay in its mapping).
  LiveVerifier(const GgufFile& gguf, VerifyOptions opts);
  // The same on a given engine for `gguf`'s model (opts.device and opts.weights are then not
  // used): the tests run verify on the backend engine over the CPU reference, the GPU's stand-in.
  LiveVerifier(const GgufFile& gguf, VerifyOptions opts, std::unique_ptr<Engine> engine);
  ~LiveVerifier();
  ModelGeometry geometry() const;
  std::string device() const;  // the engine's: "cpu", or "cuda:N (name)"
  // Whether decode-time rules step inside the engine (VerifyOptions::rules_in_engine, and an
  // engine that runs them); else every policy steps on the host.
  bool rules_in_engine() const;
  // The configs, then the chunk-reuse ways (verify/chunk_reuse.h: a chunked request,
  // query-agnostic), whose results follow the configs' in LiveRequestResult::configs.
  LiveRequestResult run(const CaptureRequest& request, const std::vector<ReplayConfig>& configs,
                        const std::vector<ReuseConfig>& reuse = {});

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvsim
