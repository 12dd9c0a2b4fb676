#pragma once
// The policy interface. Policies propose, the engine applies: a policy reads a LayerSignals view
// and returns a LayerPlan (a per-token encoding per KV head); only sim/ (offline replay) or the
// engine's KV manager (live verify) change cache state. Nothing here knows about traces or HDF5,
// so the same policy objects run offline and live.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/decode_rule.h"
#include "core/geometry.h"
#include "core/rope.h"

namespace kvsim {

// Row-major [rows, cols] floats, borrowed.
struct MatrixView {
  const float* data = nullptr;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  const float* row(std::int64_t i) const { return data + i * cols; }
  float at(std::int64_t i, std::int64_t j) const { return data[i * cols + j]; }
  bool empty() const { return rows == 0; }
};

// A row-major matrix the caller owns (for signals too large to keep around per layer).
struct OwnedMatrix {
  std::vector<float> data;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  MatrixView view() const { return {data.data(), rows, cols}; }
};

// KVzip's context-reconstruction pass over one layer (capture --repeat-pass, or run live): the
// model, on top of the prompt's cache, repeated the context in chunks; chunk c's context tokens
// [begin, end) were repeated in pass rows [row_begin, row_end), which attended to the prompt
// cache and causally to their own chunk's rows. Post-RoPE, borrowed.
struct RepeatPassView {
  struct Chunk {
    std::int64_t begin = 0, end = 0, row_begin = 0, row_end = 0;
  };
  std::vector<Chunk> chunks;
  std::int64_t rows = 0;
  const float* q = nullptr;  // [rows, n_q_heads, head_dim]
  const float* k = nullptr;  // [rows, n_kv_heads, head_dim]
};

// What a policy may look at for one layer at a compression point. The request has seen tokens
// [0, n); each KV head's cache holds some of them (all, until a compression dropped some).
// Per-head quantities have one entry per cached token of that head, in cached() order; all
// tensors are post-RoPE, as the engine caches them.
class LayerSignals {
 public:
  virtual ~LayerSignals() = default;
  virtual const ModelGeometry& geometry() const = 0;
  virtual int layer() const = 0;
  virtual std::int64_t n_tokens() const = 0;                    // tokens seen, n
  virtual std::span<const std::int32_t> positions() const = 0;  // [n], by token index
  virtual std::span<const std::int8_t> segments() const = 0;    // [n], Segment codes, by token index
  // The token indices KV head kv_head holds, increasing; the newest tokens are always there.
  virtual std::span<const std::int32_t> cached(int kv_head) const = 0;
  virtual MatrixView keys(int kv_head) const = 0;    // [cached, d]
  virtual MatrixView values(int kv_head) const = 0;  // [cached, d]
  // Attention rows of the queries of the last `window` tokens (causal softmax over the head's
  // cached keys, fp32), [window, cached], for one query head. Throws naming what is missing
  // when those queries were not recorded.
  virtual MatrixView window_attention(int q_head, int window) const = 0;
  // Attention rows, over the head's cached keys, of every seen token whose query was recorded,
  // [m, cached], and those tokens' indices. Computed on each call and owned by the caller: with
  // every prompt query recorded it is n x n per query head, too large to keep for a layer.
  virtual OwnedMatrix observed_attention(int q_head) const = 0;
  // The same rows in blocks of consecutive rows, in order: visit(first_row, block), block
  // [rows, cached]. For policies that reduce over the rows (column sums, maxima): a long prompt's
  // n x n per head is then never held at once. By default one block, observed_attention().
  virtual void visit_observed_attention(int q_head,
                                        const std::function<void(std::int64_t, const MatrixView&)>& visit) const {
    const OwnedMatrix a = observed_attention(q_head);
    visit(0, a.view());
  }
  virtual std::span<const std::int32_t> observed_rows() const = 0;
  // The recorded post-RoPE queries of those tokens, [m, d] (rows as observed_rows()).
  virtual MatrixView observed_queries(int q_head) const = 0;
  // Per-layer memo: the first call with `owner` stores make()'s result, later calls (e.g. the
  // same policy at other budgets) get it back. Thread-safe; lives as long as this view.
  virtual std::shared_ptr<const void> memo(const void* owner,
                                           const std::function<std::shared_ptr<const void>()>& make) const = 0;
  // The layer's reconstruction pass, or null when the trace (or live run) has none.
  virtual const RepeatPassView* repeat_pass() const { return nullptr; }
  // Oracle signal, offline only: attention (over the full, uncompressed cache, restricted to
  // the head's cached tokens) of the evaluation queries after the compression point,
  // [e, cached]. Live engines throw: the future is not known there.
  virtual MatrixView future_attention(int q_head) const = 0;
};

enum class TokenCodec : std::uint8_t { Drop = 0, Fp16, Int8, Int4, Int2, LowRank };

class KvCodec;  // policies/codec.h: how a policy's non-fp16 encodings are stored and read back

// What a policy already computed for its codec (e.g. a low-rank basis and every token's
// coefficients), handed on with the plan so the codec need not recompute it; opaque to engines.
struct CodecData {
  virtual ~CodecData() = default;
};

// Encoding of each cached token of one KV head (keys and values alike), in cached() order.
struct HeadPlan {
  std::vector<TokenCodec> codec;          // [cached]
  std::vector<std::uint16_t> rank;        // [cached] or empty: coefficients kept per LowRank token
  std::shared_ptr<const CodecData> data;  // the codec's precomputed state for these cached tokens, or null
  // The codec could not hold every token, and the policy kept the sinks and most recent tokens by
  // position instead of by its rule (reported per config as position_fallback).
  bool position_fallback = false;
  // [cached] or empty: a bias added to each kept token's attention logit (a soft-gated run, whose
  // gates scale attention instead of dropping tokens). Live engines only: replay refuses it.
  std::vector<float> logit_bias;
  std::int64_t kept() const;  // tokens not dropped
};

// heads has one entry per KV head (the group's query heads share it), or one per query head:
// each query head then keeps its own copy of K/V, as SnapKV's original code does by repeating
// K/V before compressing (G times the memory per kept token; the engine counts every copy).
struct LayerPlan {
  std::vector<HeadPlan> heads;  // [n_kv_heads] or [n_q_heads]
};

// Tokens each (layer, KV head) may keep at this compression point, derived by the engine from
// the byte budget and the policy's per-token state bytes; protected windows count inside it.
// A plan with one entry per query head shares this among the group: tokens / group each.
struct Budget {
  Budget(std::int64_t tokens_ = 0, double fraction_ = 1.0, std::shared_ptr<const void> across = nullptr)
      : tokens(tokens_), fraction(fraction_), across_layers(std::move(across)) {}
  std::int64_t tokens = 0;
  double fraction = 1.0;  // the byte budget as a fraction of the full fp16 cache
  // For a policy that selects across layers: what its select_across_layers() made of every
  // layer's summary (the same for each layer of the request); null otherwise.
  std::shared_ptr<const void> across_layers;
};

// One decode step as a decode-time policy sees it: token `token` has joined every KV head's cache
// and its query has attended over the cache, with the weights renormalised over the kept tokens
// (softmax restricted to the cache), as in the original H2O and TOVA.
struct DecodeStep {
  DecodeStep(std::int64_t token_, std::span<const std::vector<std::int32_t>> cache_,
             std::span<const std::vector<float>> attention_, std::int64_t budget_, int segment_ = -1)
      : token(token_), cache(cache_), attention(attention_), budget(budget_), segment(segment_) {}
  std::int64_t token = 0;
  std::span<const std::vector<std::int32_t>> cache;  // [n_kv_heads] token indices, increasing
  std::span<const std::vector<float>> attention;     // [n_q_heads] weights aligned with cache[q / group]
  std::int64_t budget = 0;                           // tokens each KV head may keep after the step
  int segment = -1;  // the joining token's Segment code (traces/trace_schema.h), -1 when unknown
  // The layer's signals over the cache as it is now (the token joined), built on demand by the
  // engine: how it re-applies a one-shot policy's rule while decoding (kvcache/reapply.h). Null
  // when the engine offers none.
  const std::function<std::shared_ptr<const LayerSignals>()>* signals = nullptr;
};

// Per-layer state of a policy that keeps evicting while decoding; created at the compression
// point, then fed every decode step by the engine (offline replay or live). It must copy what
// it needs from the LayerSignals it starts from: those do not outlive start_decode().
class DecodeState {
 public:
  virtual ~DecodeState() = default;
  // Fills evict[kv] with the token indices to drop from KV head kv's cache after this step.
  virtual void step(const DecodeStep& step, std::vector<std::vector<std::int32_t>>& evict) = 0;
  // False when step() never reads DecodeStep::attention (e.g. position-only rules): the engine
  // then skips gathering it.
  virtual bool needs_attention() const { return true; }
  // Tiered policies (codec plans) may re-encode their cache after a step instead of only
  // evicting: returning true with `plan` (one HeadPlan per KV head over step.cache's tokens, in
  // order) makes the engine re-encode every token from its original fp16 rows (a quantized
  // token is recoverable: its host copy is counted by KvCodec::host_bytes) and drop Drop ones.
  // Called right after step() with the cache after its evictions; step.attention is empty.
  virtual bool retier(const DecodeStep& step, LayerPlan& plan) {
    (void)step, (void)plan;
    return false;
  }
  // The rule step() applies, stated as data with the state it has now (core/decode_rule.h), for
  // policies whose step is one: an engine may then run the steps where its cache is (the GPU)
  // instead of calling step(). The engine's steps must evict exactly what step() would.
  virtual std::optional<DecodeRuleStart> rule() const { return std::nullopt; }
};

class Policy {
 public:
  virtual ~Policy() = default;
  // Prefill-time (one-shot) compression of one layer.
  virtual LayerPlan compress(const LayerSignals& signals, const Budget& budget) const = 0;
  // Bytes of per-token state the policy keeps beside K/V in each (layer, KV head), e.g. an
  // fp32 accumulated score: counted in the memory model and in the budget.
  virtual double state_bytes_per_token() const { return 0.0; }
  // Bytes of fixed state per plan entry (per KV head, or per query head) and layer: e.g. the
  // int32 length table of a ragged cache whose heads keep different numbers of tokens.
  virtual double state_bytes_per_head() const { return 0.0; }
  // False for the `full` reference: it ignores budgets.
  virtual bool respects_budget() const { return true; }
  // True for oracles that read LayerSignals::future_attention(): a live run then has to
  // provide it from its full-cache reference run.
  virtual bool reads_future() const { return false; }
  // True for policies that score with KVzip's reconstruction pass: replay reads it from the trace,
  // live verify runs it.
  virtual bool needs_repeat_pass() const { return false; }
  // Policies that select over every layer at once (KVzip's level=model: one threshold over all
  // layers and heads) return true. The engine then gives each layer's signals at the compression
  // point to layer_summary(), hands the summaries in layer order to select_across_layers(), and
  // passes its result to every layer's compress() in Budget::across_layers. Such a policy
  // compresses once, at the compression point (no --compress-every cuts).
  virtual bool selects_across_layers() const { return false; }
  // False for a policy whose layers each plan their part of one model-wide allocation (rlkv): a
  // layer re-applying it alone while decoding would move tokens between layers, so peak semantics
  // refuse it.
  virtual bool reapplies_per_layer() const { return true; }
  virtual std::shared_ptr<const void> layer_summary(const LayerSignals& s) const {
    (void)s;
    return nullptr;
  }
  virtual std::shared_ptr<const void> select_across_layers(const std::vector<std::shared_ptr<const void>>& summaries,
                                                           const Budget& budget) const {
    (void)summaries, (void)budget;
    return nullptr;
  }
  // Policies whose plans encode tokens other than Drop/Fp16 name the codec that stores them;
  // the engine then counts its bytes and reconstructs K/V through it.
  virtual const KvCodec* codec() const { return nullptr; }
  // Decode-time policies return their per-layer state, starting from the plan compress() made;
  // one-shot (prefill) policies return nullptr and never evict again.
  virtual std::unique_ptr<DecodeState> start_decode(const LayerSignals& signals, const LayerPlan& initial,
                                                    const Budget& budget) const {
    (void)signals, (void)initial, (void)budget;
    return nullptr;
  }
  // Tokens the cache of a decode-time policy may grow by between two of its evictions or re-tiers
  // (1: it evicts at every step; QEvict: its re-tier interval); 0 for one-shot policies. A
  // peak-matched budget leaves this much headroom below the byte budget (kvcache/budget.h).
  virtual std::int64_t decode_growth() const { return 0; }
  // Learned policies: the fingerprints (core/fingerprint.h) of the prompts they were trained on;
  // sweep and verify refuse to evaluate them on those unless asked.
  virtual std::span<const std::uint64_t> training_prompts() const { return {}; }
};

}  // namespace kvsim
