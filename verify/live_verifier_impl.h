#pragma once
// LiveVerifier's insides, shared by its two sources: live_reference.cpp (the per-request
// full-cache run every config shares: prefill, reference continuation, signals) and
// live_verifier.cpp (each config compressed, stepped and scored through kvcache/'s plan API).
#include "verify/live_verifier.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <utility>

#include "prompts/prompt.h"
#include "prompts/repeat_pass.h"
#include "core/error.h"
#include "core/half.h"
#include "kvcache/budget.h"
#include "kvcache/cache_signals.h"
#include "kvcache/plan_apply.h"
#include "kvcache/reapply.h"
#include "model/engine.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "policies/codec.h"
#include "traces/trace_schema.h"
#include "verify/chunk_reuse.h"
#include "verify/engine_rows.h"

namespace kvsim {

using kvcache::CacheSignals;
using kvcache::CacheView;
using kvcache::FloatBuffer;
using kvcache::LayerIndex;
using kvcache::Mat;

namespace live_detail {

using Clock = std::chrono::steady_clock;
inline double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

inline std::vector<double> log_softmax(const std::vector<float>& logits) {
  const double mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - mx);
  const double lse = mx + std::log(sum);
  std::vector<double> out(logits.size());
  for (std::size_t i = 0; i < logits.size(); ++i) out[i] = static_cast<double>(logits[i]) - lse;
  return out;
}

inline std::int32_t argmax(const std::vector<float>& v) {
  return static_cast<std::int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// Appends f16-rounded rows (what a trace would store) to a query buffer.
inline void append_rounded(FloatBuffer& dst, const float* src, std::size_t n) {
  std::vector<std::uint16_t> h(n);
  floats_to_halves(src, h.data(), n);
  const std::size_t at = dst.size();
  dst.resize(at + n);
  halves_to_floats(h.data(), dst.data() + at, n);
}

// RULER's string_match_all: the share of expected strings found, case-insensitively.
inline double task_score(const std::string& text, const std::vector<std::string>& expected) {
  if (expected.empty()) return std::numeric_limits<double>::quiet_NaN();
  auto lower = [](std::string s) {
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
    return s;
  };
  const std::string t = lower(text);
  double hit = 0;
  for (const auto& e : expected) hit += t.find(lower(e)) != std::string::npos ? 1 : 0;
  return hit / static_cast<double>(expected.size());
}

}  // namespace live_detail

struct LiveVerifier::Impl {
  const GgufFile& gguf;
  VerifyOptions opts;
  Tokenizer tok;
  std::unique_ptr<Engine> engine;
  Engine& model;
  ModelGeometry g;
  std::string default_system;
  std::int64_t ctx_len;
  ChunkStates chunk_states;  // chunks' K/V alone, for chunk-reuse configs

  Impl(const GgufFile& f, VerifyOptions o, std::unique_ptr<Engine> e)
      : gguf(f),
        opts(o),
        tok(f),
        engine(e ? std::move(e) : make_engine(f, EngineOptions{o.device, o.weights})),
        model(*engine),
        default_system(default_system_prompt(f)),
        ctx_len(f.get_int(model.config().arch + ".context_length", 1 << 30)),
        chunk_states(model, o.prefill_chunk) {
    g = model.config();
  }

  // What every config of one request shares.
  struct Shared {
    std::string where;
    Prompt p;
    std::int64_t c = 0, n_prompt = 0, first_q = 0;
    // Whether compression can change the first continuation token's prediction: query-agnostic
    // (the question runs on the compressed cache), or with cuts before the compression point.
    bool first_affected = false;
    RequestHeader header;                       // positions, segments and recorded queries, for the signals
    std::vector<FloatBuffer> queries;           // [layer] recorded prompt queries [m, Hq, d]
    KvCache at_point;                           // the full cache at the compression point
    std::vector<float> prefill_logits;          // query-aware: the prediction of the first continuation token
    std::vector<std::int32_t> reference;        // full-cache greedy continuation
    std::vector<std::vector<double>> ref_logp;  // [j] log-probs predicting reference[j]
    std::vector<FloatBuffer> eval_queries;      // [layer] queries of tokens >= c in the reference run
    std::vector<std::int64_t> eval_tokens;
    KvCache final_cache;                                  // the reference run's cache, every token
    std::vector<std::optional<std::vector<Mat>>> future;  // [layer] oracle signal, built on demand
    // Every config compresses the same cache, so as in replay one signals object per layer
    // serves them all (and its memo shares scores across budgets). Built on first use.
    bool with_future = false;
    std::vector<std::unique_ptr<CacheView>> views;
    std::vector<std::unique_ptr<CacheSignals>> signals;
    // KVzip's reconstruction pass, run when a policy scores with it.
    bool with_repeat = false;
    RepeatPass repeat;
    std::vector<RepeatPassView> repeat_views;  // [layer]
  };

  // A config's compressed state: the budget it is held to, what each layer holds (as the plan
  // API applied it, mirrored onto the engine's rows) and its decode-time states.
  struct Compressed {
    ConfigBudget budget;
    const KvCodec* codec = nullptr;
    double entry_budget = 0;                           // bytes one entry may hold after a re-tier
    std::vector<LayerIndex> index;                     // [layer]
    std::vector<std::unique_ptr<EngineRows>> rows;     // [layer]
    std::vector<std::unique_ptr<DecodeState>> states;  // [layer], null for one-shot policies
    bool any_state = false;
    // [layer] the state's rule runs inside the engine (DecodeState::rule, Engine::decode_rule_step);
    // the others step on the host, reading the last-row weights when they need them.
    std::vector<bool> in_engine;
    bool any_in_engine = false, host_weights = false;
    kvcache::FallbackCount fallback;        // plan entries made, and those kept by position
    std::span<const std::int8_t> segments;  // by token index (Shared::header's), for DecodeStep
    // With compression cuts before the compression point (--compress-every) the config prefills
    // on its own cache: its queries and, query-aware, the last prompt token's logits.
    std::vector<FloatBuffer> queries;  // [layer], as Shared::queries
    std::vector<float> prefill_logits;
    // Peak semantics: one-shot policies re-apply while decoding (kvcache/reapply.h), on signals
    // that see this config's own queries since the compression point too.
    bool reapplies = false;
    std::vector<std::int32_t> q_index;  // tokens whose queries `queries` holds
    double peak_bytes = 0;              // the most the cache held at a step (ConfigResult's decode peak)
  };

  // The prompt on the full cache up to the compression point, its queries recorded (and KVzip's
  // reconstruction pass run when `with_repeat`); the cache there is saved for every config.
  Shared prefill(const CaptureRequest& r, bool with_repeat);

  // Prompt tokens [b, e) through the engine, their queries from s.first_q on appended to
  // `queries` (f16-rounded, as a trace stores them); query-aware, the last prompt token's logits.
  void prefill_range(const Shared& s, std::int64_t b, std::int64_t e, std::vector<FloatBuffer>& queries,
                     std::vector<float>& last_logits);

  // The full-cache continuation: question tokens (query-agnostic), then greedy until EOS or
  // max_new, every generated token run through (its query is an evaluation query, as in a trace).
  void reference_run(Shared& s);

  // Oracle signal of one layer: the reference run's evaluation queries attending over its full
  // cache (causally), per query head, [eval, every token].
  const std::vector<Mat>& future_attention(Shared& s, int layer);

  // What policies see of layer `layer` of a cache (its entries): the tokens and a copy of their
  // rows, the oracle's future attention restricted to them, the reconstruction pass (not at
  // compression cuts, as in replay: it is recorded once, over the whole context).
  std::unique_ptr<CacheView> live_view(Shared& s, int layer, const std::vector<KvEntry>& entries, bool at_cut = false);

  // The shared full cache's signals at the compression point: every config compresses the same
  // cache, so as in replay one signals object per layer serves them all (and its memo shares
  // scores across budgets). Built on first use.
  const CacheSignals& signals_at(Shared& s, int layer);

  static kvcache::RequestTokens tokens_of(const RequestHeader& h) { return {h.positions, h.segments, h.q_index}; }

  // The prompt prefilled on the config's own cache, cut at every cut before the compression point
  // where a layer exceeds its budget (the plan's drops only, as replay applies them).
  void prefill_with_cuts(Shared& s, const ReplayConfig& cfg, Compressed& cs, const std::vector<std::int64_t>& cuts,
                         const std::vector<bool>& compresses);

  // Compresses the shared cache with `cfg` for real, layer by layer, through the plan API (the
  // replay's own), after the config's own prefill with cuts when --compress-every asks for them.
  // `start` (a chunk-reuse config's cache) replaces the shared cache at the compression point.
  Compressed compress(Shared& s, const ReplayConfig& cfg, LiveConfigResult& res, const KvCache* start = nullptr);

  // One layer's plan at the compression point, applied; its decode-time state started.
  void compress_layer(Shared& s, const ReplayConfig& cfg, Compressed& out, int l, bool chunked);

  // Rules start once every layer is compressed: they apply to the cache the next pass loads.
  void start_rules(Compressed& out);

  // One token on the compressed cache, then decode-time eviction in every layer that has a
  // state (the token has joined and its query attended, as in replay), through the plan API.
  std::vector<float> step(Shared& s, std::int32_t token, Compressed& cs, const std::string& label);

  // Layer `layer`'s signals over the config's cache as it is after n tokens, from the fp16
  // originals when the layer keeps them (what a re-applied policy plans from, as in replay).
  std::shared_ptr<const LayerSignals> signals_now(Shared& s, Compressed& cs, int layer, std::int64_t n);

  // Bytes of the config's cache now, over every layer.
  double held_bytes(const Compressed& cs) const;
  // One layer's bytes; a sliding-window layer holds at most its window (the engine masks the rest).
  double layer_held_bytes(int layer, const LayerIndex& index, const Compressed& cs) const;
  std::int64_t held_rows(int layer, const LayerIndex& index) const;
  std::vector<std::vector<std::int32_t>> held_tokens(int layer, const LayerIndex& index) const;

  // The question tokens after a query-agnostic compression point; returns the last logits (or
  // the prefill's, query-aware).
  std::vector<float> run_question(Shared& s, Compressed& cs, const std::string& label);

  LiveConfigResult run_config(Shared& s, const ReplayConfig& cfg, const std::vector<std::string>& expected,
                              const KvCache* start = nullptr);

  // A chunk-reuse config: the context's cache as `way` serves it, then the question and the
  // continuation on it, uncompressed, scored as run_config scores.
  LiveConfigResult run_reuse(Shared& s, const ReuseConfig& way, const std::vector<std::string>& expected);

  std::vector<std::int32_t> strip_eos(std::vector<std::int32_t> ids) const;
};

}  // namespace kvsim
