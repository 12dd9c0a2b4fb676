#pragma once
// The one place where a policy's plan changes a cache (policies propose, the manager applies).
// Offline replay keeps index views over a trace, live verify the engine's rows: both call these
// functions, so plans are checked, tokens kept, decode-time evictions applied and caches
// re-tiered by the same code, and a live run mirrors each change onto its rows (RowSink).
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvcache/budget.h"
#include "kvcache/config.h"
#include "policies/codec.h"
#include "policies/policy.h"

namespace kvsim::kvcache {

// A layer's cache as token indices: per entry (a KV head, or a query head after a
// per-query-head plan) the tokens it holds, increasing, and how they are stored. With `listed`
// (a policy with a codec planned the layer) encoding[e]'s non-Drop entries line up with tokens[e]
// (a plan as the policy made it may still list the tokens it dropped); without, every token is
// fp16 and the encodings stay empty.
struct LayerIndex {
  std::vector<std::vector<std::int32_t>> tokens;  // [entry]
  std::vector<HeadPlan> encoding;                 // [entry]
  bool listed = false;
  static LayerIndex prefix(int entries, std::int64_t n);  // every entry holds [0, n) in fp16
  std::int64_t rows() const;                              // tokens held over every entry
  std::vector<std::int64_t> sizes() const;                // tokens held per entry
};

// What holds the rows (the engine's cache, live) and mirrors every change the manager makes.
// Offline replay has none: its rows stay in the trace.
class RowSink {
 public:
  virtual ~RowSink() = default;
  // Each entry keeps only the listed tokens: one list per entry, or one per query head when the
  // entries are KV heads (each query head then gets its own copy of its KV head's rows).
  virtual void keep(const std::vector<std::vector<std::int32_t>>& keep) = 0;
  virtual void evict(int entry, std::span<const std::int32_t> tokens) = 0;
  // Entry `entry`'s rows now read back as `plan` stores them, re-encoded from the original fp16
  // rows (plan's non-Drop entries line up with the tokens the entry holds).
  virtual void encode(int entry, const HeadPlan& plan) = 0;
  // Entry `entry`'s rows get these attention-logit biases, one per row (HeadPlan::logit_bias of
  // the tokens it keeps). A cache that cannot hold them throws.
  virtual void bias(int entry, std::vector<float> bias) = 0;
};

// Whether some entry of the plan biases attention logits (HeadPlan::logit_bias): a soft-gated
// run, which only a live engine can hold.
bool has_logit_bias(const LayerPlan& plan);
// Offline replay's check: throws, naming the policy and the way out, when the plan has logit biases.
void refuse_logit_bias_offline(const ReplayConfig& cfg, const LayerPlan& plan);

// Checks a plan against the cache it was made for: one entry per KV head or per query head,
// each covering its head's cached tokens, every encoding one the policy can store. Throws
// naming the policy. Returns whether the plan has one entry per query head.
bool check_plan(const ReplayConfig& cfg, const LayerPlan& plan, const std::vector<std::int64_t>& cached,
                const ModelGeometry& g);

// Whether a config compresses this layer at all. A budget below 1.0 of a policy that respects
// budgets does; at 1.0 the policy is asked anyway and must keep every token (throws if it
// drops any), except that a per-query-head plan compresses as usual (G copies of the cache do
// not fit the bytes of one).
bool needs_compression(const ReplayConfig& cfg, const ConfigBudget& b, const LayerSignals& s);

// Plan entries a config made, and those whose codec kept tokens by position
// (HeadPlan::position_fallback): what both engines report as position_fallback.
struct FallbackCount {
  std::int64_t plans = 0, fallbacks = 0;
  void add(const LayerPlan& plan);
  double share() const { return plans ? static_cast<double>(fallbacks) / static_cast<double>(plans) : 0.0; }
};

// A policy that selects across layers compresses once, at the compression point: with more cuts
// than that one (--compress-every) this throws, naming the policy and the way out.
void check_no_cuts_across_layers(const ReplayConfig& cfg, std::size_t cuts);

// The policy's plan for the cache `s` shows (`cached` tokens per KV head), held to `b`, checked.
// With `one_entry_per_kv_head` (compression cuts, re-application) a per-query-head plan is refused,
// and so is a soft-gated one (logit biases), which only a single compression keeps whole.
LayerPlan make_plan(const ReplayConfig& cfg, const ConfigBudget& b, const LayerSignals& s,
                    const std::vector<std::int64_t>& cached, bool one_entry_per_kv_head = false);

// Applies a plan to `cache` (checking it first): each entry keeps its non-Drop tokens, encoded as
// planned (per-query-head plans give each query head its own entry); `rows` mirrors it, logit
// biases included (without `rows`, a plan with logit biases is refused). The
// encoding is kept as the policy made it when the policy has a codec, else left implicit (fp16).
void apply_plan(const ReplayConfig& cfg, const LayerPlan& plan, const ModelGeometry& g, LayerIndex& cache,
                RowSink* rows);

// The plan's drops alone, every kept token fp16: what a cut before the compression point applies
// (encodings apply once, at the compression point, from the original rows).
LayerPlan drops_only(const LayerPlan& plan);

// A cut before the compression point (--compress-every): when some entry holds more than the
// budget's tokens, the policy's plan for the cache `s` shows, its drops applied (and mirrored).
// Returns whether it cut.
bool apply_cut(const ReplayConfig& cfg, const ConfigBudget& b, const LayerSignals& s, LayerIndex& cache, RowSink* rows);
// Whether some entry holds more than `tokens`.
bool over_budget(const LayerIndex& cache, std::int64_t tokens);

// One cut of a compression schedule, on either side: only a cache that outgrew the budget is cut,
// and only then are its signals built (`with_signals(f)` builds them over the cache as it is and
// calls f with them). Returns whether it cut.
template <class WithSignals>
bool cut_if_over(const ReplayConfig& cfg, const ConfigBudget& b, LayerIndex& cache, RowSink* rows,
                 WithSignals&& with_signals) {
  if (!over_budget(cache, b.tokens)) return false;
  bool cut = false;
  with_signals([&](const LayerSignals& s) { cut = apply_cut(cfg, b, s, cache, rows); });
  return cut;
}

// A head's encoding with its Drop entries left out: one entry per kept token, in order. The
// codec data stays (its charges still hold; a codec refits data that no longer lines up).
HeadPlan without_drops(const HeadPlan& plan);

// A plan over all n tokens [0, n), Drop where `cache` holds nothing, from one over the tokens
// `cache` holds: how the last of several cuts is stated at the compression point.
LayerPlan widen_plan(const LayerPlan& plan, const LayerIndex& cache, std::int64_t n);

// A decode step's token joins every entry, in fp16.
void append_token(LayerIndex& cache, std::int32_t token);

// A one-shot head plan as a bit set over [0, n): bit j set where token j is kept (not Drop), and
// how many are kept. What replay shares partial attention outputs over.
struct KeepBits {
  std::vector<std::uint64_t> words;
  std::int64_t kept = 0;
};
KeepBits keep_bits(const HeadPlan& plan, std::int64_t n);

// Drops evict[e] from entry e after decode step `step` (one list per entry), checking each is
// held and, when max_rows >= 0, that no entry holds more than max_rows afterwards. Throws naming
// `label`.
void apply_evictions(const std::string& label, const std::vector<std::vector<std::int32_t>>& evict, std::int64_t step,
                     std::int64_t max_rows, LayerIndex& cache, RowSink* rows);

// A re-tiering policy's new encoding of layer `layer` after step `step` (DecodeState::retier's
// plan, one entry per KV head over the tokens held): Drop tokens leave, the rest are re-encoded
// from their original rows. Throws when the plan does not fit the cache or an entry's bytes
// exceed `entry_budget`.
void apply_retier(const std::string& label, const LayerPlan& next, int layer, std::int64_t step, const KvCodec& codec,
                  double entry_budget, int head_dim, LayerIndex& cache, RowSink* rows);

// fp16 bytes of the held tokens minus what their codec stores, and the bytes of host copies
// (recoverable tiers), over every entry of a listed layer (nothing saved when it is not listed).
struct CodecBytes {
  double saving = 0, host = 0;
};
CodecBytes codec_bytes(const KvCodec& codec, const LayerIndex& cache, int head_dim);

// Device bytes of a layer's cache held to `b`: rows x (K/V + per-token state), the per-entry
// state, less what encoded entries save.
double layer_bytes(const LayerIndex& cache, const ConfigBudget& b, const KvCodec* codec, int head_dim);

}  // namespace kvsim::kvcache
