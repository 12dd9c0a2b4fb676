#include "verify/live_verifier.h"

#include <algorithm>
#include <utility>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>

#include "model/gguf.h"
#include "model/engine.h"
#include "capture/prompt.h"
#include "capture/repeat_pass.h"
#include "model/tokenizer.h"
#include "core/error.h"
#include "core/half.h"
#include "kvcache/budget.h"
#include "kvcache/cache_signals.h"
#include "kvcache/plan_apply.h"
#include "policies/codec.h"
#include "traces/trace_schema.h"
#include "verify/engine_rows.h"

namespace kvsim {

using kvcache::CacheSignals;
using kvcache::CacheView;
using kvcache::FloatBuffer;
using kvcache::LayerIndex;
using kvcache::Mat;

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::vector<double> log_softmax(const std::vector<float>& logits) {
  const double mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - mx);
  const double lse = mx + std::log(sum);
  std::vector<double> out(logits.size());
  for (std::size_t i = 0; i < logits.size(); ++i) out[i] = static_cast<double>(logits[i]) - lse;
  return out;
}

std::int32_t argmax(const std::vector<float>& v) {
  return static_cast<std::int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// Appends f16-rounded rows (what a trace would store) to a query buffer.
void append_rounded(FloatBuffer& dst, const float* src, std::size_t n) {
  std::vector<std::uint16_t> h(n);
  floats_to_halves(src, h.data(), n);
  const std::size_t at = dst.size();
  dst.resize(at + n);
  halves_to_floats(h.data(), dst.data() + at, n);
}

// RULER's string_match_all: the share of expected strings found, case-insensitively.
double task_score(const std::string& text, const std::vector<std::string>& expected) {
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

}  // namespace

struct LiveVerifier::Impl {
  const GgufFile& gguf;
  VerifyOptions opts;
  Tokenizer tok;
  std::unique_ptr<Engine> engine;
  Engine& model;
  ModelGeometry g;
  std::string default_system;
  std::int64_t ctx_len;

  Impl(const GgufFile& f, VerifyOptions o, std::unique_ptr<Engine> e)
      : gguf(f), opts(o), tok(f), engine(e ? std::move(e) : make_engine(f, EngineOptions{o.device, o.weights})), model(*engine), default_system(default_system_prompt(f)),
        ctx_len(f.get_int(model.config().arch + ".context_length", 1 << 30)) {
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
    RequestHeader header;                 // positions, segments and recorded queries, for the signals
    std::vector<FloatBuffer> queries;     // [layer] recorded prompt queries [m, Hq, d]
    KvCache at_point;                     // the full cache at the compression point
    std::vector<float> prefill_logits;    // query-aware: the prediction of the first continuation token
    std::vector<std::int32_t> reference;  // full-cache greedy continuation
    std::vector<std::vector<double>> ref_logp;  // [j] log-probs predicting reference[j]
    std::vector<FloatBuffer> eval_queries;      // [layer] queries of tokens >= c in the reference run
    std::vector<std::int64_t> eval_tokens;
    KvCache final_cache;                        // the reference run's cache, every token
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
    // With compression cuts before the compression point (--compress-every) the config prefills
    // on its own cache: its queries and, query-aware, the last prompt token's logits.
    std::vector<FloatBuffer> queries;  // [layer], as Shared::queries
    std::vector<float> prefill_logits;
  };

  Shared prefill(const CaptureRequest& r, bool with_repeat) {
    Shared s;
    s.with_repeat = with_repeat;
    s.where = "live run of request '" + r.id + "' (line " + std::to_string(r.line) + ")";
    s.p = build_prompt(tok, r, default_system);
    s.n_prompt = static_cast<std::int64_t>(s.p.tokens.size());
    s.c = opts.mode == ReplayMode::QueryAware ? s.n_prompt : s.p.question_start;
    if (s.n_prompt + opts.max_new > ctx_len)
      throw Error(s.where + ": prompt + continuation is " + std::to_string(s.n_prompt + opts.max_new) +
                  " tokens, over the model's context of " + std::to_string(ctx_len));
    if (s.c < 1) throw Error(s.where + ": empty prompt");
    s.first_affected = opts.mode == ReplayMode::QueryAgnostic || compression_cuts(s.c, opts.compress_every).size() > 1;
    s.first_q = opts.all_queries ? 0 : std::max<std::int64_t>(0, s.p.question_start - opts.query_window);
    const std::int64_t T = s.n_prompt + opts.max_new;
    s.header.id = r.id;
    s.header.tokens = s.p.tokens;
    s.header.segments = s.p.segments;
    s.header.positions.resize(static_cast<std::size_t>(T));
    for (std::int64_t i = 0; i < T; ++i) s.header.positions[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i);
    s.header.segments.resize(static_cast<std::size_t>(T), static_cast<std::int8_t>(Segment::Generated));
    for (std::int64_t i = s.first_q; i < s.c; ++i) s.header.q_index.push_back(static_cast<std::int32_t>(i));
    s.header.n_prompt = s.n_prompt;
    s.header.question_start = s.p.question_start;
    s.header.needle_start = s.p.needle_start;
    s.header.needle_end = s.p.needle_end;

    model.reset();
    model.reserve(T);
    model.record_last_attention(false);
    s.queries.assign(static_cast<std::size_t>(g.n_layers), {});
    for (const auto& [b, e] : prefill_chunks(s.c, {s.p.question_start}, opts.prefill_chunk)) {
      prefill_range(s, b, e, s.queries, s.prefill_logits);
      // As in capture: the pass runs on the cache holding exactly the context.
      if (s.with_repeat && e == context_span(s.p).second) s.repeat = run_repeat_pass(model, tok, s.p);
    }
    if (s.with_repeat) {
      if (s.repeat.chunks.empty()) throw Error(s.where + ": kvzip needs a context to repeat, and this request has none");
      for (int l = 0; l < g.n_layers; ++l) {
        RepeatPassView v;
        for (const RepeatChunk& ch : s.repeat.chunks) v.chunks.push_back({ch.begin, ch.end, ch.row_begin, ch.row_end});
        v.rows = s.repeat.rows;
        v.q = s.repeat.q[static_cast<std::size_t>(l)].data();
        v.k = s.repeat.k[static_cast<std::size_t>(l)].data();
        s.repeat_views.push_back(std::move(v));
      }
    }
    s.at_point = std::as_const(model).cache();
    return s;
  }

  // Prompt tokens [b, e) through the engine, their queries from s.first_q on appended to
  // `queries` (f16-rounded, as a trace stores them); query-aware, the last prompt token's logits.
  void prefill_range(const Shared& s, std::int64_t b, std::int64_t e, std::vector<FloatBuffer>& queries,
                     std::vector<float>& last_logits) {
    const auto q_row = static_cast<std::size_t>(g.n_q_heads) * static_cast<std::size_t>(g.head_dim);
    auto hook = [&](const LayerActivations& a) {
      const std::int64_t skip = std::clamp<std::int64_t>(s.first_q - b, 0, a.n);
      append_rounded(queries[static_cast<std::size_t>(a.layer)], a.q.data() + static_cast<std::size_t>(skip) * q_row,
                     static_cast<std::size_t>(a.n - skip) * q_row);
    };
    std::vector<std::int32_t> pos(static_cast<std::size_t>(e - b));
    for (std::size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<std::int32_t>(b) + static_cast<std::int32_t>(i);
    const std::int64_t last = e - b - 1;
    const bool want = e == s.c && opts.mode == ReplayMode::QueryAware;
    auto logits = model.forward(std::span(s.p.tokens).subspan(static_cast<std::size_t>(b), static_cast<std::size_t>(e - b)), pos,
                                want ? std::span<const std::int64_t>(&last, 1) : std::span<const std::int64_t>(), hook);
    if (want) last_logits = std::move(logits);
  }

  // The full-cache continuation: question tokens (query-agnostic), then greedy until EOS or
  // max_new, every generated token run through (its query is an evaluation query, as in a trace).
  void reference_run(Shared& s) {
    const ModelConfig& c = model.config();
    const auto q_row = static_cast<std::size_t>(c.n_q_heads) * static_cast<std::size_t>(c.head_dim);
    s.eval_queries.assign(static_cast<std::size_t>(c.n_layers), {});
    auto hook = [&](const LayerActivations& a) {
      append_rounded(s.eval_queries[static_cast<std::size_t>(a.layer)], a.q.data(), static_cast<std::size_t>(a.n) * q_row);
    };
    model.set_cache(s.at_point);
    std::vector<float> logits = s.prefill_logits;
    for (std::int64_t t = s.c; t < s.n_prompt; ++t) {
      s.eval_tokens.push_back(t);
      logits = model.step(s.p.tokens[static_cast<std::size_t>(t)], hook);
    }
    for (int j = 0; j < opts.max_new; ++j) {
      const std::int32_t next = argmax(logits);
      s.reference.push_back(next);
      s.ref_logp.push_back(log_softmax(logits));
      s.eval_tokens.push_back(model.cached_tokens());
      logits = model.step(next, hook);
      if (next == tok.eos()) break;
    }
    s.final_cache = std::as_const(model).cache();
    s.future.assign(static_cast<std::size_t>(c.n_layers), std::nullopt);
  }

  // Oracle signal of one layer: the reference run's evaluation queries attending over its full
  // cache (causally), restricted to the tokens before the compression point, per query head.
  const std::vector<Mat>& future_attention(Shared& s, int layer) {
    auto& slot = s.future[static_cast<std::size_t>(layer)];
    if (slot) return *slot;
    const int Hq = g.n_q_heads, d = g.head_dim, G = g.group();
    const auto E = static_cast<Eigen::Index>(s.eval_tokens.size());
    std::vector<std::int64_t> limit(s.eval_tokens.begin(), s.eval_tokens.end());
    std::vector<Mat> out(static_cast<std::size_t>(Hq));
    const auto& entries = s.final_cache.layers[static_cast<std::size_t>(layer)];
    const FloatBuffer& q = s.eval_queries[static_cast<std::size_t>(layer)];
    for (int hq = 0; hq < Hq; ++hq) {
      const KvEntry& e = entries[static_cast<std::size_t>(hq / G)];
      const Eigen::Map<const Mat, 0, Eigen::OuterStride<>> qh(q.data() + hq * d, E, d, Eigen::OuterStride<>(Hq * d));
      const Eigen::Map<const Mat> k(e.k.data(), e.rows(), d);
      Mat a = (qh * (1.0f / std::sqrt(static_cast<float>(d)))) * k.transpose();
      kvcache::causal_softmax(a, limit);
      out[static_cast<std::size_t>(hq)] = a.leftCols(s.c);
    }
    slot = std::move(out);
    return *slot;
  }

  // What policies see of layer `layer` of a cache (its entries): the tokens and a copy of their
  // rows, the oracle's future attention restricted to them, the reconstruction pass (not at
  // compression cuts, as in replay: it is recorded once, over the whole context).
  std::unique_ptr<CacheView> live_view(Shared& s, int layer, const std::vector<KvEntry>& entries, bool at_cut = false) {
    auto view = std::make_unique<CacheView>();
    for (const KvEntry& e : entries) {
      view->tokens.push_back(e.tokens);
      view->keys.push_back(Eigen::Map<const Mat>(e.k.data(), e.rows(), g.head_dim));
      view->values.push_back(Eigen::Map<const Mat>(e.v.data(), e.rows(), g.head_dim));
    }
    if (s.with_future) {
      const std::vector<Mat>& future = future_attention(s, layer);
      for (int hq = 0; hq < g.n_q_heads; ++hq) {
        const auto& held = view->tokens[static_cast<std::size_t>(hq / g.group())];
        const Mat& f = future[static_cast<std::size_t>(hq)];
        Mat cols(f.rows(), static_cast<Eigen::Index>(held.size()));
        for (std::size_t m = 0; m < held.size(); ++m) cols.col(static_cast<Eigen::Index>(m)) = f.col(held[m]);
        view->future.push_back(std::move(cols));
      }
    }
    if (s.with_repeat && !at_cut) view->repeat = &s.repeat_views[static_cast<std::size_t>(layer)];
    return view;
  }

  // The shared full cache's signals at the compression point: every config compresses the same
  // cache, so as in replay one signals object per layer serves them all (and its memo shares
  // scores across budgets). Built on first use.
  const CacheSignals& signals_at(Shared& s, int layer) {
    if (s.signals.empty()) {
      s.views.resize(static_cast<std::size_t>(g.n_layers));
      s.signals.resize(static_cast<std::size_t>(g.n_layers));
    }
    auto& slot = s.signals[static_cast<std::size_t>(layer)];
    if (slot) return *slot;
    s.views[static_cast<std::size_t>(layer)] = live_view(s, layer, s.at_point.layers[static_cast<std::size_t>(layer)]);
    slot = std::make_unique<CacheSignals>(s.where, g, layer, s.c, tokens_of(s.header),
                                          s.queries[static_cast<std::size_t>(layer)], *s.views[static_cast<std::size_t>(layer)]);
    return *slot;
  }

  static kvcache::RequestTokens tokens_of(const RequestHeader& h) { return {h.positions, h.segments, h.q_index}; }

  // The prompt prefilled on the config's own cache, cut at every cut before the compression point
  // where a layer exceeds its budget (the plan's drops only, as replay applies them).
  void prefill_with_cuts(Shared& s, const ReplayConfig& cfg, Compressed& cs, const std::vector<std::int64_t>& cuts,
                         const std::vector<bool>& compresses) {
    model.reset();
    model.reserve(s.n_prompt + opts.max_new);
    model.record_last_attention(false);
    cs.queries.assign(static_cast<std::size_t>(g.n_layers), {});
    for (auto& index : cs.index) index = LayerIndex::prefix(g.n_kv_heads, 0);
    std::vector<std::int64_t> splits = cuts;
    splits.push_back(s.p.question_start);
    for (const auto& [b, e] : prefill_chunks(s.c, splits, opts.prefill_chunk)) {
      prefill_range(s, b, e, cs.queries, cs.prefill_logits);
      for (auto& index : cs.index)
        for (std::int64_t j = b; j < e; ++j) kvcache::append_token(index, static_cast<std::int32_t>(j));
      if (e == s.c || std::find(cuts.begin(), cuts.end(), e) == cuts.end()) continue;
      for (int l = 0; l < g.n_layers; ++l) {
        auto& index = cs.index[static_cast<std::size_t>(l)];
        const auto sizes = index.sizes();
        if (!compresses[static_cast<std::size_t>(l)] ||
            std::none_of(sizes.begin(), sizes.end(), [&](std::int64_t n) { return n > cs.budget.tokens; }))
          continue;
        const auto view = live_view(s, l, std::as_const(model).cache().layers[static_cast<std::size_t>(l)], true);
        const CacheSignals signals(s.where, g, l, e, tokens_of(s.header), cs.queries[static_cast<std::size_t>(l)], *view);
        const LayerPlan plan = kvcache::make_plan(cfg, cs.budget, signals, index.sizes(), true);
        kvcache::apply_plan(cfg, kvcache::drops_only(plan), g, index, cs.rows[static_cast<std::size_t>(l)].get());
      }
    }
  }

  // Compresses the shared cache with `cfg` for real, layer by layer, through the plan API (the
  // replay's own), after the config's own prefill with cuts when --compress-every asks for them.
  Compressed compress(Shared& s, const ReplayConfig& cfg, LiveConfigResult& res) {
    const auto L = static_cast<std::size_t>(g.n_layers);
    Compressed out;
    out.budget = config_budget(*cfg.impl, cfg.budget, s.c, g.head_dim);
    out.codec = cfg.impl->codec();
    out.entry_budget = cfg.budget * static_cast<double>(s.c) * out.budget.kv_token_bytes;
    out.index.resize(L);
    out.states.resize(L);
    out.prefill_logits = s.prefill_logits;
    res.budget_tokens = out.budget.tokens;
    std::vector<bool> compresses(L);
    for (std::size_t l = 0; l < L; ++l)  // (a compressing budget needs no signals to say so)
      compresses[l] = out.budget.compress || kvcache::needs_compression(cfg, out.budget, signals_at(s, static_cast<int>(l)));
    for (int l = 0; l < g.n_layers; ++l)
      out.rows.push_back(std::make_unique<EngineRows>(model, l, g, out.codec, s.header.positions));
    const std::vector<std::int64_t> cuts = compression_cuts(s.c, opts.compress_every);
    const bool chunked = cuts.size() > 1 && std::find(compresses.begin(), compresses.end(), true) != compresses.end();
    if (chunked) {
      prefill_with_cuts(s, cfg, out, cuts, compresses);
    } else {
      model.set_cache(s.at_point);
      for (auto& index : out.index) index = LayerIndex::prefix(g.n_kv_heads, s.c);
    }
    for (int l = 0; l < g.n_layers; ++l) {
      const auto li = static_cast<std::size_t>(l);
      if (compresses[li]) compress_layer(s, cfg, out, l, chunked);
      check_mirror(model, l, out.index[li], cfg.label());
      res.kept.push_back(out.index[li].tokens);
    }
    start_rules(out);
    res.policy_steps = !out.any_state ? "none" : out.any_in_engine ? "engine" : "host";
    double bytes = 0, rows = 0;
    for (const LayerIndex& index : out.index) {
      bytes += kvcache::layer_bytes(index, out.budget, out.codec, g.head_dim);
      rows += static_cast<double>(index.rows());
    }
    res.compressed_bytes = bytes;
    res.budget_bytes = cfg.budget * static_cast<double>(s.c) * g.n_layers * g.n_kv_heads * out.budget.kv_token_bytes;
    res.kept_fraction = rows / (static_cast<double>(g.n_layers) * g.n_kv_heads * static_cast<double>(s.c));
    return out;
  }

  // One layer's plan at the compression point, applied; its decode-time state started.
  void compress_layer(Shared& s, const ReplayConfig& cfg, Compressed& out, int l, bool chunked) {
    const auto li = static_cast<std::size_t>(l);
    std::unique_ptr<CacheView> own_view;
    std::unique_ptr<CacheSignals> own;
    if (chunked) {
      own_view = live_view(s, l, std::as_const(model).cache().layers[li], true);
      own = std::make_unique<CacheSignals>(s.where, g, l, s.c, tokens_of(s.header), out.queries[li], *own_view);
    }
    const CacheSignals& signals = chunked ? *own : signals_at(s, l);
    const LayerPlan plan = kvcache::make_plan(cfg, out.budget, signals, out.index[li].sizes(), chunked);
    EngineRows& rows = *out.rows[li];
    if (out.codec) rows.keep_originals();
    kvcache::apply_plan(cfg, plan, g, out.index[li], &rows);
    out.states[li] = cfg.impl->start_decode(signals, plan, Budget{out.budget.tokens, cfg.budget});
    if (out.states[li]) {
      if (static_cast<int>(plan.heads.size()) != g.n_kv_heads)
        throw Error("policy " + cfg.policy + ": per-query-head plans with decode-time eviction are not supported");
      out.any_state = true;
    } else {
      rows.drop_originals();  // a one-shot codec never re-encodes
    }
  }

  // Rules start once every layer is compressed: they apply to the cache the next pass loads.
  void start_rules(Compressed& out) {
    out.in_engine.assign(static_cast<std::size_t>(g.n_layers), false);
    for (int l = 0; l < g.n_layers; ++l) {
      const auto li = static_cast<std::size_t>(l);
      const DecodeState* state = out.states[li].get();
      if (!state) continue;
      std::optional<DecodeRuleStart> rule;
      if (opts.rules_in_engine && model.runs_decode_rules() && !out.rows[li]->has_originals()) rule = state->rule();
      if (rule) {
        model.start_decode_rule(l, *rule);
        out.in_engine[li] = true;
        out.any_in_engine = true;
      } else if (state->needs_attention()) {
        out.host_weights = true;
      }
    }
  }

  // One token on the compressed cache, then decode-time eviction in every layer that has a
  // state (the token has joined and its query attended, as in replay), through the plan API.
  std::vector<float> step(std::int32_t token, Compressed& cs, const std::string& label) {
    model.record_last_attention(cs.host_weights);
    std::vector<float> logits = model.step(token);
    const auto t = static_cast<std::int32_t>(model.cached_tokens() - 1);
    for (LayerIndex& index : cs.index) kvcache::append_token(index, t);
    if (!cs.any_state) return logits;
    // An eviction policy's cache fits its budget after every step (a protected window may not let it).
    const std::int64_t max_rows = std::max<std::int64_t>(cs.budget.tokens, 0);
    if (cs.any_in_engine) {
      const auto evicted = model.decode_rule_step(cs.budget.tokens);  // gone from the cache already
      for (int l = 0; l < g.n_layers; ++l)
        if (cs.in_engine[static_cast<std::size_t>(l)])
          kvcache::apply_evictions(label, evicted[static_cast<std::size_t>(l)], t, max_rows,
                                   cs.index[static_cast<std::size_t>(l)], nullptr);
    }
    for (int l = 0; l < g.n_layers; ++l) {
      const auto li = static_cast<std::size_t>(l);
      DecodeState* state = cs.states[li].get();
      if (!state || cs.in_engine[li]) continue;
      EngineRows& rows = *cs.rows[li];
      const bool tiered = rows.has_originals();
      rows.joined();  // the new token's rows are original (fp16): the host copy gets them too
      std::vector<std::vector<float>> weights(static_cast<std::size_t>(g.n_q_heads));
      if (state->needs_attention())
        for (int hq = 0; hq < g.n_q_heads; ++hq) {
          const auto w = model.last_attention(l, hq);
          weights[static_cast<std::size_t>(hq)].assign(w.begin(), w.end());
        }
      LayerIndex& index = cs.index[li];
      std::vector<std::vector<std::int32_t>> evict(static_cast<std::size_t>(g.n_kv_heads));
      state->step(DecodeStep{t, index.tokens, weights, cs.budget.tokens}, evict);
      kvcache::apply_evictions(label, evict, t, tiered ? -1 : max_rows, index, &rows);
      LayerPlan next;
      if (tiered && state->retier(DecodeStep{t, index.tokens, {}, cs.budget.tokens}, next))
        kvcache::apply_retier(label, next, l, t, *cs.codec, cs.entry_budget, g.head_dim, index, &rows);
    }
    return logits;
  }

  // The question tokens after a query-agnostic compression point; returns the last logits (or
  // the prefill's, query-aware).
  std::vector<float> run_question(Shared& s, Compressed& cs, const std::string& label) {
    std::vector<float> logits = cs.prefill_logits;
    for (std::int64_t t = s.c; t < s.n_prompt; ++t) logits = step(s.p.tokens[static_cast<std::size_t>(t)], cs, label);
    return logits;
  }

  LiveConfigResult run_config(Shared& s, const ReplayConfig& cfg, const std::vector<std::string>& expected) {
    const auto t0 = Clock::now();
    LiveConfigResult res;
    Compressed cs = compress(s, cfg, res);
    // Teacher-forced on the reference continuation.
    std::vector<float> logits = run_question(s, cs, cfg.label());
    const auto len = s.reference.size();
    double kl_sum = 0, nll_sum = 0, top1 = 0;
    std::size_t diverged = len;
    for (std::size_t j = 0; j < len; ++j) {
      const bool affected = j > 0 || s.first_affected;
      if (affected) {
        const auto lq = log_softmax(logits);
        const auto& lp = s.ref_logp[j];
        double kl = 0;
        for (std::size_t v = 0; v < lp.size(); ++v) kl += std::exp(lp[v]) * (lp[v] - lq[v]);
        kl = std::max(kl, 0.0);
        kl_sum += kl;
        res.max_kl = std::max(res.max_kl, kl);
        nll_sum -= lq[static_cast<std::size_t>(s.reference[j])];
        const bool same = argmax(logits) == s.reference[j];
        top1 += same ? 1 : 0;
        if (!same && diverged == len) diverged = j;
        ++res.steps;
      }
      if (j + 1 < len) logits = step(s.reference[j], cs, cfg.label());
    }
    res.final_rows = std::as_const(model).cache().entries_rows();
    for (int l = 0; l < g.n_layers; ++l) {
      check_mirror(model, l, cs.index[static_cast<std::size_t>(l)], cfg.label());
      res.final_kept.push_back(cs.index[static_cast<std::size_t>(l)].tokens);
    }
    const auto n = static_cast<double>(res.steps);
    res.mean_kl = res.steps ? kl_sum / n : 0;
    res.top1 = res.steps ? top1 / n : 1;
    res.ppl = res.steps ? std::exp(nll_sum / n) : 1;
    // Free-running: identical to the reference until the first divergent prediction, so only a
    // divergent config pays for a second run.
    std::vector<std::int32_t> generated = s.reference;
    if (diverged < len) {
      res.kept.clear();
      cs = compress(s, cfg, res);
      logits = run_question(s, cs, cfg.label());
      generated.clear();
      for (int j = 0; j < opts.max_new; ++j) {
        const std::int32_t next = argmax(logits);
        generated.push_back(next);
        if (next == tok.eos()) break;
        if (j + 1 < opts.max_new) logits = step(next, cs, cfg.label());
      }
      for (int l = 0; l < g.n_layers; ++l) check_mirror(model, l, cs.index[static_cast<std::size_t>(l)], cfg.label());
    }
    res.same_tokens = generated == s.reference;
    res.generated = tok.decode(strip_eos(generated));
    res.task_score = task_score(res.generated, expected);
    res.seconds = since(t0);
    return res;
  }

  std::vector<std::int32_t> strip_eos(std::vector<std::int32_t> ids) const {
    if (!ids.empty() && ids.back() == tok.eos()) ids.pop_back();
    return ids;
  }
};

namespace {

const VerifyOptions& checked(const VerifyOptions& o) {
  if (o.max_new < 2) throw Error("--max-new must be >= 2 (the first continuation token is not affected query-aware)");
  if (o.prefill_chunk < 1 || o.query_window < 0) throw Error("--prefill-chunk must be >= 1 and --query-window >= 0");
  if (o.compress_every < 0) throw Error("--compress-every must be >= 0 (0: compress once, at the compression point)");
  return o;
}

}  // namespace

LiveVerifier::LiveVerifier(const GgufFile& gguf, VerifyOptions opts)
    : impl_(std::make_unique<Impl>(gguf, checked(opts), nullptr)) {}

LiveVerifier::LiveVerifier(const GgufFile& gguf, VerifyOptions opts, std::unique_ptr<Engine> engine)
    : impl_(std::make_unique<Impl>(gguf, checked(opts), std::move(engine))) {}

LiveVerifier::~LiveVerifier() = default;

ModelGeometry LiveVerifier::geometry() const { return impl_->g; }

std::string LiveVerifier::device() const { return impl_->model.device(); }

bool LiveVerifier::rules_in_engine() const { return impl_->opts.rules_in_engine && impl_->model.runs_decode_rules(); }

LiveRequestResult LiveVerifier::run(const CaptureRequest& request, const std::vector<ReplayConfig>& configs) {
  const auto t0 = Clock::now();
  Impl::Shared s = impl_->prefill(request, std::any_of(configs.begin(), configs.end(), [](const ReplayConfig& c) {
    return c.impl->needs_repeat_pass();
  }));
  s.with_future = std::any_of(configs.begin(), configs.end(), [](const ReplayConfig& c) { return c.impl->reads_future(); });
  impl_->reference_run(s);
  LiveRequestResult out;
  out.request = request.id;
  out.task = request.task;
  out.compression_point = s.c;
  out.prompt_tokens = s.n_prompt;
  out.reference = s.reference;
  out.reference_text = impl_->tok.decode(impl_->strip_eos(s.reference));
  const auto expected = expected_strings(request);
  out.reference_task_score = task_score(out.reference_text, expected);
  double nll = 0;
  std::int64_t steps = 0;
  for (std::size_t j = 0; j < s.reference.size(); ++j) {
    if (j == 0 && !s.first_affected) continue;
    nll -= s.ref_logp[j][static_cast<std::size_t>(s.reference[j])];
    ++steps;
  }
  out.reference_ppl = steps ? std::exp(nll / static_cast<double>(steps)) : 1;
  out.shared_seconds = since(t0);
  for (const ReplayConfig& cfg : configs) out.configs.push_back(impl_->run_config(s, cfg, expected));
  return out;
}

}  // namespace kvsim
