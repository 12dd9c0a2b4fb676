#pragma once
// Internals of the replay engine (sim/replay_*.cpp only): shared types and the steps of one
// layer. Eigen stays here, out of sim/replay.h.
#include <Eigen/Dense>
#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvcache/budget.h"
#include "policies/policy.h"
#include "kvcache/cache_signals.h"
#include "kvcache/plan_apply.h"
#include "sim/replay.h"
#include "traces/trace_schema.h"

namespace kvsim::replay_detail {

using kvcache::CacheSignals;
using kvcache::CacheView;
using kvcache::causal_softmax;
using kvcache::FloatBuffer;
using kvcache::gather_view;
using kvcache::Mat;
using kvcache::StridedMap;

// Accumulates one config's per-row metrics over the layers of a request.
struct Accumulator {
  std::vector<std::vector<float>> kl, err;  // [layer][row]
  std::vector<double> layer_recall, layer_kl, layer_err;
  std::vector<double> layer_out_sq;  // sum of squared absolute output errors, err^2 x |o|^2
  std::vector<std::int64_t> layer_rows;
  std::vector<double> head_kl;  // [layer * query heads + head]: KL summed over its rows
  std::vector<std::int64_t> head_rows;
  int heads = 0;         // query heads
  double full_rows = 0;  // K/V rows of the full cache at the compression point
  // Sliding-window layers, held at their window and charged fp16 K/V only (no policy state).
  int window_layers = 0;
  double window_rows = 0;                 // at the compression point
  std::vector<double> window_prefill;     // [c] at each prefill step
  std::vector<double> window_after_step;  // [T - c] after each later step
  std::int64_t kept = 0;                  // right after compression, over layers and heads
  std::int64_t entries = 0;               // plan entries of one layer (KV or query heads)
  std::vector<double> kept_after_step;    // [T - c] cache size after each later step
  std::vector<double> prefill_size;       // [c] cache size at each prefill step (all layers, heads)
  std::uint64_t hash = 1469598103934665603ull;
  double codec_saving = 0;                // fp16 bytes of the kept rows minus what their codec stores
  std::vector<double> saving_after_step;  // [T - c] the same after each later step (re-tiering changes it)
  double host_bytes = 0;                  // peak bytes of host copies (recoverable tiers)
  kvcache::FallbackCount fallback;        // plan entries made, and those kept by position
  std::vector<std::vector<std::vector<std::int32_t>>> kept_sets;  // [layer][entry], when recorded
  // With Replayer::record_steps: per layer and evaluation row, |o - o'|^2 summed over query heads.
  std::vector<std::vector<double>> step_out_sq;

  void mix(std::uint64_t x) { hash = (hash ^ x) * 1099511628211ull; }  // FNV-1a
  // Eviction only: the compressed row is the full one renormalised over the kept tokens, whose
  // KL(compressed || full) is -log(recall).
  // out_norm2: the squared norm of the row's full-cache output, which turns its relative error
  // into the absolute one the offline estimate (sim/estimator.h) weighs.
  // `row`: the evaluation row (the decode step) it scores.
  void add_row(int layer, int head, std::int64_t row, double recall, double row_err, double out_norm2) {
    recall = std::clamp(recall, 1e-30, 1.0);
    add_row(layer, head, row, recall, -std::log(recall), row_err, out_norm2);
  }
  void add_row(int layer, int head, std::int64_t row, double recall, double kl_row, double row_err, double out_norm2) {
    const auto h = static_cast<std::size_t>(layer) * static_cast<std::size_t>(heads) + static_cast<std::size_t>(head);
    head_kl[h] += kl_row;
    ++head_rows[h];
    kl[static_cast<std::size_t>(layer)].push_back(static_cast<float>(kl_row));
    err[static_cast<std::size_t>(layer)].push_back(static_cast<float>(row_err));
    layer_recall[static_cast<std::size_t>(layer)] += recall;
    layer_kl[static_cast<std::size_t>(layer)] += kl_row;
    layer_err[static_cast<std::size_t>(layer)] += row_err;
    layer_out_sq[static_cast<std::size_t>(layer)] += row_err * row_err * out_norm2;
    if (!step_out_sq.empty())
      step_out_sq[static_cast<std::size_t>(layer)][static_cast<std::size_t>(row)] += row_err * row_err * out_norm2;
    ++layer_rows[static_cast<std::size_t>(layer)];
  }
};

// A one-shot plan with encoded tokens, accounted in phase A and scored after it: configs whose
// plans come out identical (say, every budget at which a quantizer already keeps every token)
// are found before any is scored, and score once.
struct CodedShot {
  std::size_t config = 0;
  const KvCodec* codec = nullptr;
  LayerPlan plan;
};
// Its metrics per query head and evaluation row.
struct CodedRows {
  std::vector<std::vector<double>> recall, kl, err;  // [Hq][E]
};

// Everything one layer shares across configs.
struct LayerWork {
  const ModelGeometry& g;
  int layer;
  std::int64_t c, E, T;
  std::int64_t compress_every;  // 0: one compression at c; else also every this many tokens
  bool record_keep_sets;        // fill Accumulator::kept_sets
  const std::string& where;
  const RequestHeader& h;
  const kvcache::RequestTokens& tokens;          // h as the signals see it
  const FloatBuffer& q;                          // this layer's recorded queries
  const std::vector<Mat>& full_k;                // [Hkv] T x d
  const std::vector<std::int64_t>& eval_tokens;  // [E] token index of each evaluation row
  const CacheSignals& signals;
  const std::vector<Mat>& attn;      // [Hq] full attention of the evaluation rows, E x T
  const std::vector<Mat>& out;       // [Hq] full attention outputs, E x d
  const std::vector<Mat>& out_tail;  // [Hq] part of out from tokens >= c (never compressed here)
  const std::vector<Eigen::VectorXf>& tail_mass;
  const std::vector<Mat>& full_v;  // [Hkv] T x d
  std::int64_t first_eval;         // row of q holding the first evaluation query
  const std::vector<Mat>& logits;  // [Hq] E x T scaled logits before the softmax (kept when a codec config needs them)
  const std::vector<Eigen::VectorXd>& lse;  // [Hq] E: logsumexp of each full row (with logits)
};

// A one-shot config's keep-sets in one layer: a bitset over the c cached tokens per query head
// (query heads of a group share their KV head's set unless the plan has one per query head).
struct OneShot {
  std::size_t config = 0;
  std::vector<std::vector<std::uint64_t>> bits;  // [Hq][ceil(c / 64)]
  std::vector<std::int64_t> count;               // kept tokens per query head
};

// Order in which to build the shots' partial outputs for one query head (see spanning_tree).
struct BuildOrder {
  std::vector<std::size_t> order;
  std::vector<std::int64_t> parent;  // -1 empty set, -2 full set, else a shot index
};

// The weights a decode-time policy reads at evaluation row i: each query head's full attention
// restricted to its KV head's cache and renormalised over it (softmax restricted to the cache).
// Returns, per query head, the mass the cache held before renormalising (the row's recall);
// with renormalise false the weights stay unnormalised.
inline std::vector<double> cache_weights(const LayerWork& w, std::int64_t i,
                                         const std::vector<std::vector<std::int32_t>>& cache,
                                         std::vector<std::vector<float>>& weights, bool renormalise) {
  const int Hq = w.g.n_q_heads, G = w.g.group();
  std::vector<double> mass(static_cast<std::size_t>(Hq));
  for (int qh = 0; qh < Hq; ++qh) {
    const auto& ch = cache[static_cast<std::size_t>(qh / G)];
    const Mat& A = w.attn[static_cast<std::size_t>(qh)];
    auto& wt = weights[static_cast<std::size_t>(qh)];
    wt.resize(ch.size());
    double m = 0;
    for (std::size_t k = 0; k < ch.size(); ++k) m += (wt[k] = A(i, ch[k]));
    mass[static_cast<std::size_t>(qh)] = m;
    if (renormalise)
      for (auto& x : wt) x = static_cast<float>(x / m);
  }
  return mass;
}

// The Segment code of token t, as a decode-time policy is told it when the token joins.
inline int segment_of(const LayerWork& w, std::int64_t t) {
  return static_cast<std::size_t>(t) < w.tokens.segments.size() ? w.tokens.segments[static_cast<std::size_t>(t)] : -1;
}

// The layer's signals over a decode-time cache after n tokens (DecodeStep::signals): what a
// policy re-applied under peak semantics plans from, built like the compression point's. Its
// future (the oracles' signal) is the evaluation rows still to come: queries of tokens >= n.
inline std::shared_ptr<const LayerSignals> signals_over(const LayerWork& w,
                                                        const std::vector<std::vector<std::int32_t>>& cache,
                                                        std::int64_t n) {
  struct Held {
    CacheView view;
    std::optional<CacheSignals> signals;
  };
  auto held = std::make_shared<Held>();
  const auto first = std::lower_bound(w.eval_tokens.begin(), w.eval_tokens.end(), n) - w.eval_tokens.begin();
  held->view = gather_view(cache, w.full_k, w.full_v, w.attn, w.g.group(), first);
  held->signals.emplace(w.where, w.g, w.layer, n, w.tokens, w.q, held->view);
  return std::shared_ptr<const LayerSignals>(held, &*held->signals);
}

// Phase A of a layer for one config (replay_shots.cpp): a keep-set for phase B, an encoded plan
// to score, or neither (the config was replayed, or needs no compression).
struct Planned {
  std::optional<OneShot> shot;
  std::optional<CodedShot> coded;
};
Planned plan_config(std::size_t index, const ReplayConfig& cfg, const ConfigBudget& budget, const LayerWork& w,
                    Accumulator& a);
// Decode-time configs (replay_decode.cpp).
// A decode-time config needs the query of every token after the compression point; throws
// naming the policy and `why` ("evicts at every decode step") when the trace recorded fewer.
void require_decode_queries(const ReplayConfig& cfg, const LayerWork& w, const std::string& why);

void replay_decode(const ReplayConfig& cfg, const ConfigBudget& b, const LayerWork& w, const LayerPlan& plan,
                   DecodeState& state, Accumulator& a);
// One-shot plans with encoded tokens (replay_codec.cpp): the memory accounting (phase A), which
// shots are identical (per shot, the first shot it equals), the scoring and the rows.
CodedShot account_codec(std::size_t index, const ReplayConfig& cfg, const LayerPlan& plan, const LayerWork& w,
                        Accumulator& a);
std::vector<std::size_t> first_equal(const std::vector<CodedShot>& shots);
CodedRows score_codec(const CodedShot& shot, const LayerWork& w);
void add_codec_rows(const LayerWork& w, const CodedRows& rows, Accumulator& a);

// A sliding-window layer held at its window (replay_window.cpp; the budget's share is
// kvcache/budget.h's): its tokens, memory at every step, zero-loss rows.
void hold_window_layer(const ModelGeometry& g, int layer, std::int64_t c, std::int64_t T, std::int64_t E,
                       bool record_keep_sets, Accumulator& a);
// Plans with encoded tokens whose policy evicts or re-tiers while decoding (replay_codec.cpp).
void replay_codec_decode(const ReplayConfig& cfg, const ConfigBudget& b, const LayerWork& w, const LayerPlan& plan,
                         DecodeState& state, Accumulator& a);
// Phase B (replay_shots.cpp).
BuildOrder spanning_tree(const std::vector<OneShot>& shots, int q_head, std::int64_t c);
void score_shots(const LayerWork& w, const std::vector<OneShot>& shots, const BuildOrder& tree, int q_head,
                 std::vector<std::vector<double>>& recall_out, std::vector<std::vector<double>>& err_out);

}  // namespace kvsim::replay_detail
