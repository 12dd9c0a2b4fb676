#include "sim/replay.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <numeric>

#include "core/error.h"
#include "policies/codec.h"
#include "kvcache/budget.h"
#include "kvcache/plan_apply.h"
#include "kvcache/reapply.h"
#include "sim/replay_internal.h"

namespace kvsim {

using namespace replay_detail;

namespace {

double percentile95(std::vector<float>& v) {
  if (v.empty()) return 0;
  const auto k = static_cast<std::size_t>(std::ceil(0.95 * static_cast<double>(v.size()))) - 1;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

void start_accumulator(Accumulator& a, int L, int Hq, std::int64_t T, std::int64_t c, bool record_keep_sets,
                       std::int64_t record_steps) {
  a.heads = Hq;
  a.head_kl.assign(static_cast<std::size_t>(L) * static_cast<std::size_t>(Hq), 0);
  a.head_rows.assign(static_cast<std::size_t>(L) * static_cast<std::size_t>(Hq), 0);
  a.layer_recall.assign(static_cast<std::size_t>(L), 0);
  a.layer_kl.assign(static_cast<std::size_t>(L), 0);
  a.layer_err.assign(static_cast<std::size_t>(L), 0);
  a.layer_out_sq.assign(static_cast<std::size_t>(L), 0);
  a.layer_rows.assign(static_cast<std::size_t>(L), 0);
  a.kl.assign(static_cast<std::size_t>(L), {});
  a.err.assign(static_cast<std::size_t>(L), {});
  a.kept_after_step.assign(static_cast<std::size_t>(T - c), 0.0);
  a.saving_after_step.assign(static_cast<std::size_t>(T - c), 0.0);
  a.prefill_size.assign(static_cast<std::size_t>(c), 0.0);
  a.window_prefill.assign(static_cast<std::size_t>(c), 0.0);
  a.window_after_step.assign(static_cast<std::size_t>(T - c), 0.0);
  if (record_keep_sets) a.kept_sets.resize(static_cast<std::size_t>(L));
  if (record_steps > 0)
    a.step_out_sq.assign(static_cast<std::size_t>(L), std::vector<double>(static_cast<std::size_t>(record_steps), 0.0));
}

// One config's result from what its accumulator gathered over the layers: means and tails, and
// memory at every step of the token clock (prefill, compression, decode).
ConfigResult summarise(Accumulator& a, const ReplayConfig& cfg, const ConfigBudget& b, const ModelGeometry& g,
                       const std::string& ctx) {
  const int L = g.n_layers;
  ConfigResult r;
  r.budget_tokens = b.tokens;
  std::vector<float> all_kl, all_err;
  for (int l = 0; l < L; ++l) {
    const auto li = static_cast<std::size_t>(l);
    all_kl.insert(all_kl.end(), a.kl[li].begin(), a.kl[li].end());
    all_err.insert(all_err.end(), a.err[li].begin(), a.err[li].end());
    r.layer_p95_kl.push_back(percentile95(a.kl[li]));
    r.layer_p95_err.push_back(percentile95(a.err[li]));
  }
  r.rows = static_cast<std::int64_t>(all_kl.size());
  double sr = 0, sk = 0, se = 0, sq = 0;
  for (int l = 0; l < L; ++l) {
    const auto li = static_cast<std::size_t>(l);
    const double n = static_cast<double>(a.layer_rows[li]);
    sr += a.layer_recall[li];
    sk += a.layer_kl[li];
    se += a.layer_err[li];
    sq += a.layer_out_sq[li];
    r.layer_recall.push_back(a.layer_recall[li] / n);
    r.layer_kl.push_back(a.layer_kl[li] / n);
    r.layer_err.push_back(a.layer_err[li] / n);
    r.layer_out_sq.push_back(a.layer_out_sq[li] / n);
    std::vector<double> heads(static_cast<std::size_t>(a.heads));
    for (std::size_t h = 0; h < heads.size(); ++h) {
      const std::size_t k = li * heads.size() + h;
      heads[h] = a.head_rows[k] ? a.head_kl[k] / static_cast<double>(a.head_rows[k]) : 0.0;
    }
    r.head_kl.push_back(std::move(heads));
  }
  r.mean_recall = sr / static_cast<double>(r.rows);
  r.mean_kl = sk / static_cast<double>(r.rows);
  r.mean_err = se / static_cast<double>(r.rows);
  r.mean_out_sq = sq / static_cast<double>(r.rows);
  r.p95_kl = percentile95(all_kl);
  r.p95_err = percentile95(all_err);
  const double bpt = b.token_bytes, wb = b.kv_token_bytes;
  const int Lg = L - a.window_layers;  // the layers a policy runs on
  // Per-entry fixed state (length tables), counted for every such layer and plan entry.
  const double fixed = cache_bytes(b, 0, a.entries, Lg);
  const double kept = static_cast<double>(a.kept);
  r.kept_fraction = (kept + a.window_rows) / a.full_rows;
  // Encoded (quantized) tokens cost what their codec stores, not fp16, from compression on.
  const double saving = a.codec_saving;
  r.compressed_bytes = cache_bytes(b, kept, a.entries, Lg) + a.window_rows * wb - saving;
  r.budget_bytes = cfg.budget * a.full_rows * b.kv_token_bytes;
  r.final_bytes = a.kept_after_step.empty() ? fixed - saving + kept * bpt + a.window_rows * wb
                                            : fixed - a.saving_after_step.back() + a.kept_after_step.back() * bpt +
                                                  a.window_after_step.back() * wb;
  r.host_bytes = a.host_bytes;
  r.position_fallback = a.fallback.share();
  r.peak_bytes = 0;
  r.footprint = 0;
  for (std::size_t t = 0; t < a.prefill_size.size(); ++t) {
    const double bytes = a.prefill_size[t] * bpt + fixed + a.window_prefill[t] * wb;
    r.peak_bytes = std::max(r.peak_bytes, bytes);
    r.footprint += bytes;
  }
  // A step's token joins before the policy acts on it: the cache briefly holds the previous
  // step's tokens plus one per head, under the previous step's encoding.
  // (Per-query-head plans join one row per query head.)
  // (A sliding-window layer's joining token replaces its oldest in place once the window is full.)
  const double joining = static_cast<double>(Lg) * static_cast<double>(std::max<std::int64_t>(a.entries, g.n_kv_heads));
  double prev = kept, prev_saving = saving, prev_window = a.window_rows;
  r.decode_peak_bytes = r.compressed_bytes;
  for (std::size_t i = 0; i < a.kept_after_step.size(); ++i) {
    const double k = a.kept_after_step[i], sv = a.saving_after_step[i], w = a.window_after_step[i] * wb;
    r.decode_peak_bytes =
        std::max({r.decode_peak_bytes, (prev + joining) * bpt + fixed - prev_saving + std::max(prev_window * wb, w),
                  k * bpt + fixed - sv + w});
    r.footprint += k * bpt + fixed - sv + w;
    prev = k;
    prev_saving = sv;
    prev_window = a.window_after_step[i];
  }
  r.peak_bytes = std::max(r.peak_bytes, r.decode_peak_bytes);
  r.keep_hash = a.hash;
  r.kept = std::move(a.kept_sets);
  r.step_out_sq = std::move(a.step_out_sq);
  for (auto& layer : r.step_out_sq)
    for (double& x : layer) x /= a.heads;
  if (cfg.impl->respects_budget() && cfg.budget < 1.0 && r.compressed_bytes > r.budget_bytes + 1e-6)
    throw Error("policy " + cfg.label() + " kept " + std::to_string(r.compressed_bytes) + " bytes over budget " +
                std::to_string(r.budget_bytes) + " in " + ctx + " (a policy bug)");
  kvcache::check_peak_bytes(cfg, b, r.decode_peak_bytes, r.budget_bytes, ctx);
  return r;
}

// Every config on one layer: phase A asks each policy for its plan (decode-time configs replay to
// the end there), then the encoded plans are scored (each distinct one once) and the one-shot
// keep-sets share partial outputs along a spanning tree per query head (phase B).
void score_layer(const LayerWork& work, const std::vector<ReplayConfig>& configs,
                 const std::vector<ConfigBudget>& budgets, const std::vector<std::size_t>& heavy_first,
                 std::vector<Accumulator>& acc) {
  const std::size_t P = configs.size();
  const int Hq = work.g.n_q_heads, layer = work.layer;
  const std::int64_t c = work.c, E = work.E;
  // Exceptions must not leave an OpenMP region: keep the first, rethrow after the loop.
  std::exception_ptr failure;
  auto guard = [&](auto&& fn) {
    try {
      fn();
    } catch (...) {
#pragma omp critical(kvsim_replay_failure)
      if (!failure) failure = std::current_exception();
    }
  };
  // Phase A: plans (decode-time configs run to the end here).
  std::vector<Planned> planned(P);
#pragma omp parallel for schedule(dynamic)
  for (std::size_t k = 0; k < P; ++k) {
    const std::size_t p = heavy_first[k];
    guard([&] { planned[p] = plan_config(p, configs[p], budgets[p], work, acc[p]); });
  }
  if (failure) std::rethrow_exception(failure);
  std::vector<OneShot> shots;
  std::vector<CodedShot> coded;
  for (auto& s : planned) {
    if (s.shot) shots.push_back(std::move(*s.shot));
    if (s.coded) coded.push_back(std::move(*s.coded));
  }
  // Encoded plans score their own logits, each distinct plan once (found before any is scored,
  // so two threads never score the same one).
  const std::vector<std::size_t> first = first_equal(coded);
  std::vector<std::size_t> distinct;
  for (std::size_t k = 0; k < coded.size(); ++k)
    if (first[k] == k) distinct.push_back(k);
  std::vector<CodedRows> coded_rows(coded.size());
  // Phase B: one-shot configs share partial outputs along a spanning tree per KV head.
  // (Per query head: identical trees within a group unless a plan keeps per-query-head sets;
  // building them is a negligible popcount pass.)
  std::vector<BuildOrder> trees(static_cast<std::size_t>(Hq));
  for (int qh = 0; qh < Hq; ++qh) trees[static_cast<std::size_t>(qh)] = spanning_tree(shots, qh, c);
  std::vector<std::vector<std::vector<double>>> rec(static_cast<std::size_t>(Hq)), err(rec.size());
  // One pool of tasks: the encoded plans (several times a query head's phase B work) first, then
  // phase B per query head.
  const auto tasks = static_cast<std::int64_t>(distinct.size()) + Hq;
#pragma omp parallel for schedule(dynamic)
  for (std::int64_t t = 0; t < tasks; ++t) {
    guard([&] {
      if (t < static_cast<std::int64_t>(distinct.size())) {
        const std::size_t k = distinct[static_cast<std::size_t>(t)];
        try {
          coded_rows[k] = score_codec(coded[k], work);
        } catch (const Error& e) {  // name the policy, as phase A's errors do
          const std::string msg = e.what();
          if (msg.rfind("policy ", 0) == 0) throw;
          throw Error("policy " + configs[coded[k].config].label() + ": " + msg);
        }
        return;
      }
      const auto qh = static_cast<std::size_t>(t - static_cast<std::int64_t>(distinct.size()));
      rec[qh].resize(shots.size());
      err[qh].resize(shots.size());
      score_shots(work, shots, trees[qh], static_cast<int>(qh), rec[qh], err[qh]);
    });
  }
  if (failure) std::rethrow_exception(failure);
  for (std::size_t k = 0; k < coded.size(); ++k) add_codec_rows(work, coded_rows[first[k]], acc[coded[k].config]);
  for (std::size_t k = 0; k < shots.size(); ++k)
    for (int qh = 0; qh < Hq; ++qh)
      for (std::int64_t i = 0; i < E; ++i)
        acc[shots[k].config].add_row(layer, qh, i, rec[static_cast<std::size_t>(qh)][k][static_cast<std::size_t>(i)],
                                     err[static_cast<std::size_t>(qh)][k][static_cast<std::size_t>(i)],
                                     work.out[static_cast<std::size_t>(qh)].row(i).squaredNorm());
}

// Every config of a layer shares one pass over the trace: the full attention of the evaluation
// queries, their outputs and the parts of both from tokens after the compression point. Buffers
// live across layers: same shapes every layer, so no reallocation (large allocations churn
// mmap/munmap and TLB shootdowns otherwise).
struct SharedPass {
  const ModelGeometry& g;
  std::int64_t T, c;
  bool keep_logits;
  std::vector<Mat> full_k, full_v;               // [Hkv] T x d
  std::vector<Mat> attn, out, out_tail, logits;  // [Hq]
  std::vector<Eigen::VectorXf> tail_mass;        // [Hq]
  std::vector<Eigen::VectorXd> lse;              // [Hq]
  CacheView prefix;  // every KV head holds [0, c): the single compression point without cuts

  SharedPass(const ModelGeometry& geometry, std::int64_t tokens, std::int64_t point, bool logits_too)
      : g(geometry),
        T(tokens),
        c(point),
        keep_logits(logits_too),
        full_k(static_cast<std::size_t>(g.n_kv_heads)),
        full_v(full_k.size()),
        attn(static_cast<std::size_t>(g.n_q_heads)),
        out(attn.size()),
        out_tail(attn.size()),
        logits(attn.size()),
        tail_mass(attn.size()),
        lse(attn.size()) {
    prefix.tokens = kvcache::LayerIndex::prefix(g.n_kv_heads, c).tokens;
    prefix.keys.resize(full_k.size());
    prefix.values.resize(full_k.size());
    prefix.future.resize(attn.size());
  }

  // The layer's keys and values: the prefix the signals read and every KV head's full rows.
  void bind(const FloatBuffer& kbuf, const FloatBuffer& vbuf) {
    const int Hkv = g.n_kv_heads, d = g.head_dim;
    for (int kv = 0; kv < Hkv; ++kv) {
      const StridedMap kh(kbuf.data() + kv * d, T, d, Eigen::OuterStride<>(Hkv * d));
      const StridedMap vh(vbuf.data() + kv * d, T, d, Eigen::OuterStride<>(Hkv * d));
      prefix.keys[static_cast<std::size_t>(kv)] = kh.topRows(c);
      prefix.values[static_cast<std::size_t>(kv)] = vh.topRows(c);
      full_k[static_cast<std::size_t>(kv)] = kh;
      full_v[static_cast<std::size_t>(kv)] = vh;
    }
  }

  void compute(const FloatBuffer& kbuf, const FloatBuffer& vbuf, const FloatBuffer& qbuf, std::int64_t first_eval,
               const std::vector<std::int64_t>& eval_limit) {
    const int Hq = g.n_q_heads, d = g.head_dim, G = g.group();
    const auto E = static_cast<Eigen::Index>(eval_limit.size());
    bind(kbuf, vbuf);
#pragma omp parallel for schedule(dynamic)
    for (int qh = 0; qh < Hq; ++qh) {
      const auto i = static_cast<std::size_t>(qh);
      const StridedMap qe(qbuf.data() + (first_eval * Hq + qh) * d, E, d, Eigen::OuterStride<>(Hq * d));
      // Scale the E x d queries, not the E x T logits: one pass less over the big matrix.
      const Mat qs = qe * (1.0f / std::sqrt(static_cast<float>(d)));
      attn[i].noalias() = qs * full_k[static_cast<std::size_t>(qh / G)].transpose();
      if (keep_logits) logits[i] = attn[i];
      causal_softmax(attn[i], eval_limit, keep_logits ? &lse[i] : nullptr);
      const Mat& v = full_v[static_cast<std::size_t>(qh / G)];
      out[i].noalias() = attn[i] * v;
      out_tail[i].noalias() = attn[i].rightCols(T - c) * v.bottomRows(T - c);
      tail_mass[i] = attn[i].rightCols(T - c).rowwise().sum();
      prefix.future[i] = attn[i].leftCols(c);
    }
  }
};

}  // namespace

Replayer::Replayer(const TraceReader& reader, ReplayMode mode, std::vector<ReplayConfig> configs,
                   std::int64_t compress_every, BudgetRule rule)
    : reader_(reader), mode_(mode), configs_(std::move(configs)), compress_every_(compress_every), rule_(rule) {
  if (compress_every < 0) throw Error("--compress-every must be >= 0 (0: compress once, at the compression point)");
  for (const ReplayConfig& cfg : configs_)
    check_window_support(reader.geometry(), *cfg.impl, cfg.label(), reader.path());
}

void Replayer::select_across_layers(
    std::vector<ConfigBudget>& budgets, std::int64_t c,
    const std::function<std::unique_ptr<const kvcache::CacheSignals>(int)>& layer_signals) const {
  std::vector<std::size_t> across;
  for (std::size_t p = 0; p < configs_.size(); ++p)
    if (configs_[p].impl->selects_across_layers() && budgets[p].compress) across.push_back(p);
  if (across.empty()) return;
  kvcache::check_no_cuts_across_layers(configs_[across.front()], compression_cuts(c, compress_every_).size());
  // A pass over the layers before the scoring pass: each layer's summary, then the selection.
  std::vector<std::vector<std::shared_ptr<const void>>> summaries(across.size());
  for (int layer = 0; layer < reader_.geometry().n_layers; ++layer) {
    const auto signals = layer_signals(layer);
    for (std::size_t k = 0; k < across.size(); ++k)
      summaries[k].push_back(configs_[across[k]].impl->layer_summary(*signals));
  }
  for (std::size_t k = 0; k < across.size(); ++k) {
    ConfigBudget& b = budgets[across[k]];
    b.across_layers = configs_[across[k]].impl->select_across_layers(summaries[k], b.policy_budget());
  }
}

namespace {

// The compression point of a request in `mode` and its evaluation rows: the recorded queries at or
// after it (a suffix of q_index), each with the last token it attends to.
struct EvalRows {
  std::int64_t c = 0, first = 0, count = 0;
  std::vector<std::int64_t> limit;
};

EvalRows eval_rows(const RequestHeader& h, ReplayMode mode, const std::string& ctx) {
  EvalRows r;
  const std::int64_t T = h.n_tokens();
  r.c = mode == ReplayMode::QueryAware ? h.n_prompt : h.question_start;
  if (r.c < 1 || r.c >= T)
    throw Error(
        ctx + ": compression point " + std::to_string(r.c) + " (" + mode_name(mode) +
        ") leaves no tokens to evaluate; expected 1 <= point < T = " + std::to_string(T) +
        (mode == ReplayMode::QueryAware ? " (the request needs generated tokens)" : " (the request needs a question)"));
  r.first = static_cast<std::int64_t>(
      std::lower_bound(h.q_index.begin(), h.q_index.end(), static_cast<std::int32_t>(r.c)) - h.q_index.begin());
  r.count = h.n_queries() - r.first;
  if (r.count == 0)
    throw Error(ctx + ": no recorded queries at or after the compression point " + std::to_string(r.c) +
                "; expected the question/answer queries in q_index");
  r.limit.resize(static_cast<std::size_t>(r.count));
  for (std::int64_t i = 0; i < r.count; ++i)
    r.limit[static_cast<std::size_t>(i)] = h.q_index[static_cast<std::size_t>(r.first + i)];
  return r;
}

// The order phase A hands configs out in: those with a codec first (their plans fit bases;
// decode-time ones replay to the end there), so the phase does not end on one of them running
// alone; and each policy's first budget before any second one, so a thread rarely waits on a
// score (the layer's memo) that another thread is still computing.
std::vector<std::size_t> phase_a_order(const std::vector<ReplayConfig>& configs) {
  const std::size_t P = configs.size();
  std::vector<std::size_t> repeat_rank(P);
  std::map<const Policy*, std::size_t> seen_impl;
  for (std::size_t p = 0; p < P; ++p) repeat_rank[p] = seen_impl[configs[p].impl.get()]++;
  std::vector<std::size_t> heavy_first(P);
  std::iota(heavy_first.begin(), heavy_first.end(), std::size_t{0});
  std::stable_sort(heavy_first.begin(), heavy_first.end(), [&](std::size_t a, std::size_t b) {
    const bool ca = configs[a].impl->codec() != nullptr, cb = configs[b].impl->codec() != nullptr;
    return ca != cb ? ca : repeat_rank[a] < repeat_rank[b];
  });
  return heavy_first;
}

// KVzip's reconstruction pass, when a policy scores with it and the capture recorded it: its chunk
// table into `repeat` (the layers are read with the rest). False when there is none to hand out.
bool repeat_table(const TraceReader& reader, const std::string& id, const std::vector<ReplayConfig>& configs,
                  RepeatPassView& repeat) {
  const bool wanted = std::any_of(configs.begin(), configs.end(),
                                  [](const ReplayConfig& cfg) { return cfg.impl->needs_repeat_pass(); });
  if (!wanted || !reader.has_repeat_pass(id)) return false;
  const RepeatPass table = reader.repeat_pass_table(id);
  for (const RepeatChunk& ch : table.chunks) repeat.chunks.push_back({ch.begin, ch.end, ch.row_begin, ch.row_end});
  repeat.rows = table.rows;
  return true;
}

// Each config's budget at compression point c: sliding-window layers hold their window (full at c
// under peak semantics, or refused), a budget's rest goes to the global layers.
std::vector<ConfigBudget> budgets_at(const std::vector<ReplayConfig>& configs, const ModelGeometry& g, std::int64_t c,
                                     const BudgetRule& rule, const std::string& ctx) {
  check_window_peak(g, rule, c, ctx);
  const WindowShare windows = window_share(g, c);
  std::vector<ConfigBudget> budgets;
  for (const ReplayConfig& cfg : configs)
    budgets.push_back(config_budget(*cfg.impl, global_fraction(cfg.budget, windows, c, cfg.label()), c, g.head_dim,
                                    rule, cfg.label()));
  return budgets;
}

}  // namespace

RequestResult Replayer::replay(const std::string& request_id) const {
  const ModelGeometry& g = reader_.geometry();
  const RequestHeader h = reader_.header(request_id);
  const kvcache::RequestTokens tokens{h.positions, h.segments, h.q_index};
  const std::string ctx = reader_.path() + ": request '" + request_id + "'";
  const std::int64_t T = h.n_tokens();
  const EvalRows rows = eval_rows(h, mode_, ctx);
  const std::int64_t c = rows.c, first_eval = rows.first, E = rows.count;
  const std::vector<std::int64_t>& eval_limit = rows.limit;

  const int L = g.n_layers, Hq = g.n_q_heads, d = g.head_dim;
  const std::size_t P = configs_.size();
  // Sliding-window layers hold their window; a budget's rest goes to the global layers.
  const WindowShare windows = window_share(g, c);
  std::vector<ConfigBudget> budgets = budgets_at(configs_, g, c, rule_, ctx);
  std::vector<Accumulator> acc(P);
  for (auto& a : acc) {
    start_accumulator(a, L, Hq, T, c, record_keep_sets_, record_steps_ ? E : 0);
    a.full_rows = static_cast<double>(windows.held_tokens) * g.n_kv_heads;
  }

  using Clock = std::chrono::steady_clock;
  auto since = [](Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  double read_s = 0, attention_s = 0, config_s = 0;
  FloatBuffer kbuf(reader_.layer_elements(request_id, Tensor::K)), vbuf(kbuf.size());
  FloatBuffer qbuf(reader_.layer_elements(request_id, Tensor::Q));
  // Encoded (quantized, low-rank) configs compare their logits with the exact ones: keep those
  // instead of recomputing them per config.
  const bool keep_logits = std::any_of(configs_.begin(), configs_.end(),
                                       [](const ReplayConfig& cfg) { return cfg.impl->codec() != nullptr; });
  SharedPass pass(g, T, c, keep_logits);
  CacheView& prefix = pass.prefix;
  RepeatPassView repeat;
  std::vector<float> repeat_q, repeat_k;
  if (repeat_table(reader_, request_id, configs_, repeat)) prefix.repeat = &repeat;
  const std::vector<std::size_t> heavy_first = phase_a_order(configs_);
  // One layer of the trace read, and (for the scoring pass) its shared attention computed.
  auto load_layer = [&](int layer, bool attention) {
    auto t0 = Clock::now();
    reader_.read_layer(request_id, Tensor::K, layer, kbuf);
    reader_.read_layer(request_id, Tensor::V, layer, vbuf);
    reader_.read_layer(request_id, Tensor::Q, layer, qbuf);
    if (prefix.repeat) {
      reader_.read_repeat_layer(request_id, layer, repeat_q, repeat_k);
      repeat.q = repeat_q.data();
      repeat.k = repeat_k.data();
    }
    read_s += since(t0);
    if (!attention) {
      pass.bind(kbuf, vbuf);
      return;
    }
    t0 = Clock::now();
    pass.compute(kbuf, vbuf, qbuf, first_eval, eval_limit);
    attention_s += since(t0);
  };
  // Summaries read keys, values, queries and the repeat pass: no evaluation attention, and no
  // future (the oracles' signal) to hand out yet.
  select_across_layers(budgets, c, [&](int layer) {
    load_layer(layer, false);
    for (auto& f : prefix.future) f.resize(0, 0);
    return std::make_unique<const CacheSignals>(ctx, g, layer, c, tokens, qbuf, prefix);
  });
  for (int layer = 0; layer < L; ++layer) {
    if (g.window(layer) > 0) {  // held at its window by every config: nothing to read or score
      for (auto& a : acc) hold_window_layer(g, layer, c, T, E, record_keep_sets_, a);
      continue;
    }
    load_layer(layer, true);
    auto t0 = Clock::now();
    const CacheSignals signals(ctx, g, layer, c, tokens, qbuf, prefix);

    // One field after another, as LayerWork declares them.
    // clang-format off
    const LayerWork work{g, layer, c, E, T, compress_every_, record_keep_sets_, ctx, h, tokens, qbuf, pass.full_k,
                         eval_limit, signals, pass.attn, pass.out, pass.out_tail, pass.tail_mass, pass.full_v, first_eval,
                         pass.logits, pass.lse};
    // clang-format on
    score_layer(work, configs_, budgets, heavy_first, acc);
    config_s += since(t0);
  }

  RequestResult result;
  result.request = request_id;
  result.tokens = T;
  result.compression_point = c;
  result.eval_queries = E;
  result.eval_positions = eval_limit;
  result.read_seconds = read_s;
  result.attention_seconds = attention_s;
  result.config_seconds = config_s;
  // Per layer and query head: Q K^T and A V over all T keys, plus the tail product.
  result.attention_flops = static_cast<double>(windows.global_layers) * Hq * 2.0 * static_cast<double>(E) * d *
                           (2.0 * static_cast<double>(T) + static_cast<double>(T - c));
  for (std::size_t p = 0; p < P; ++p) result.configs.push_back(summarise(acc[p], configs_[p], budgets[p], g, ctx));
  return result;
}

}  // namespace kvsim
