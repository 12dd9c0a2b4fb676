#include "verify/live_verifier.h"

#include <algorithm>
#include <utility>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>

#include "capture/gguf.h"
#include "capture/engine.h"
#include "capture/prompt.h"
#include "capture/repeat_pass.h"
#include "capture/tokenizer.h"
#include "core/error.h"
#include "core/half.h"
#include "core/packed_kv.h"
#include "policies/codec.h"
#include "sim/budget.h"
#include "sim/cache_signals.h"
#include "traces/trace_schema.h"

namespace kvsim {

using replay_detail::CacheSignals;
using replay_detail::CacheView;
using replay_detail::FloatBuffer;
using replay_detail::Mat;

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

// What a really compressed cache stores for an entry the codec is about to encode (its rows are
// still the exact ones pack reads): a backend that holds packed entries keeps this.
std::shared_ptr<const PackedEntry> packed_form(const KvCodec* codec, const HeadPlan& plan, const KvGeometry& g,
                                               const std::vector<std::int32_t>& positions, const KvEntry& entry) {
  auto p = std::make_shared<PackedEntry>();
  pack_plan(codec, plan, g, positions, entry.k, entry.v, *p);
  return p;
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
  KvGeometry g;
  std::string default_system;
  std::int64_t ctx_len;

  Impl(const GgufFile& f, VerifyOptions o, std::unique_ptr<Engine> e)
      : gguf(f), opts(o), tok(f), engine(e ? std::move(e) : make_engine(f, EngineOptions{o.device, o.weights})), model(*engine), default_system(default_system_prompt(f)),
        ctx_len(f.get_int(model.config().arch + ".context_length", 1 << 30)) {
    const LlamaConfig& c = model.config();
    g = KvGeometry{c.n_layers, c.n_head, c.n_head_kv, c.head_dim, c.rope};
  }

  // What every config of one request shares.
  struct Shared {
    std::string where;
    Prompt p;
    std::int64_t c = 0, n_prompt = 0, first_q = 0;
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

  // A config's compressed state: the budget it is held to and its decode-time states.
  struct Compressed {
    ConfigBudget budget;
    std::vector<std::unique_ptr<DecodeState>> states;  // [layer], null for one-shot policies
    bool any_state = false;
    // [layer] the state's rule runs inside the engine (DecodeState::rule, Engine::decode_rule_step);
    // the others step on the host, reading the last-row weights when they need them.
    std::vector<bool> in_engine;
    bool any_in_engine = false, host_weights = false;
    // [layer][KV head] the cached tokens' original fp16 rows (the host copy a re-tiering policy
    // promotes from); kept only when a policy with a codec also decodes.
    std::vector<std::vector<KvEntry>> originals;
    const KvCodec* codec = nullptr;
    double fraction = 1;                          // the byte budget as a share of the full cache at c
    std::int64_t c = 0;
    const std::vector<std::int32_t>* positions = nullptr;
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

    const LlamaConfig& c = model.config();
    const auto q_row = static_cast<std::size_t>(c.n_head) * static_cast<std::size_t>(c.head_dim);
    s.queries.assign(static_cast<std::size_t>(c.n_layers), {});
    std::int64_t processed = 0;
    auto hook = [&](const LayerActivations& a) {
      const std::int64_t skip = std::clamp<std::int64_t>(s.first_q - processed, 0, a.n);
      append_rounded(s.queries[static_cast<std::size_t>(a.layer)], a.q.data() + static_cast<std::size_t>(skip) * q_row,
                     static_cast<std::size_t>(a.n - skip) * q_row);
    };
    model.reset();
    model.reserve(T);
    model.record_last_attention(false);
    for (const auto& [b, e] : prefill_chunks(s.c, s.p.question_start, opts.prefill_chunk)) {
      std::vector<std::int32_t> pos(static_cast<std::size_t>(e - b));
      for (std::size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<std::int32_t>(b) + static_cast<std::int32_t>(i);
      const std::int64_t last = e - b - 1;
      const bool want = e == s.c && opts.mode == ReplayMode::QueryAware;
      auto logits = model.forward(std::span(s.p.tokens).subspan(static_cast<std::size_t>(b), static_cast<std::size_t>(e - b)), pos,
                                  want ? std::span<const std::int64_t>(&last, 1) : std::span<const std::int64_t>(), hook);
      if (want) s.prefill_logits = std::move(logits);
      processed = e;
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

  // The full-cache continuation: question tokens (query-agnostic), then greedy until EOS or
  // max_new, every generated token run through (its query is an evaluation query, as in a trace).
  void reference_run(Shared& s) {
    const LlamaConfig& c = model.config();
    const auto q_row = static_cast<std::size_t>(c.n_head) * static_cast<std::size_t>(c.head_dim);
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
      replay_detail::causal_softmax(a, limit);
      out[static_cast<std::size_t>(hq)] = a.leftCols(s.c);
    }
    slot = std::move(out);
    return *slot;
  }

  const CacheSignals& signals_at(Shared& s, int layer) {
    if (s.signals.empty()) {
      s.views.resize(static_cast<std::size_t>(g.n_layers));
      s.signals.resize(static_cast<std::size_t>(g.n_layers));
    }
    auto& slot = s.signals[static_cast<std::size_t>(layer)];
    if (slot) return *slot;
    auto view = std::make_unique<CacheView>();
    for (const KvEntry& e : s.at_point.layers[static_cast<std::size_t>(layer)]) {
      view->tokens.push_back(e.tokens);
      view->keys.push_back(Eigen::Map<const Mat>(e.k.data(), e.rows(), g.head_dim));
      view->values.push_back(Eigen::Map<const Mat>(e.v.data(), e.rows(), g.head_dim));
    }
    if (s.with_future) view->future = future_attention(s, layer);
    if (s.with_repeat) view->repeat = &s.repeat_views[static_cast<std::size_t>(layer)];
    slot = std::make_unique<CacheSignals>(s.where, g, layer, s.c, s.header, s.queries[static_cast<std::size_t>(layer)], *view);
    s.views[static_cast<std::size_t>(layer)] = std::move(view);
    return *slot;
  }

  // Restores the shared cache and compresses it with `cfg` for real, layer by layer.
  Compressed compress(Shared& s, const ReplayConfig& cfg, LiveConfigResult& res) {
    model.set_cache(s.at_point);
    Compressed out;
    out.budget = config_budget(*cfg.impl, cfg.budget, s.c, g.head_dim);
    out.states.resize(static_cast<std::size_t>(g.n_layers));
    out.codec = cfg.impl->codec();
    out.fraction = cfg.budget;
    out.c = s.c;
    out.positions = &s.header.positions;
    res.budget_tokens = out.budget.tokens;
    std::int64_t entries = g.n_kv_heads;
    double codec_saving = 0;
    for (int l = 0; l < g.n_layers; ++l) {
      const CacheSignals& signals = signals_at(s, l);
      bool compress = out.budget.compress;
      LayerPlan plan;
      if (!compress && cfg.impl->respects_budget()) {
        // As in replay: a budget that fits the whole cache still asks the policy, which must
        // keep everything (per-query-head plans excepted: G copies do not fit one cache).
        plan = cfg.impl->compress(signals, Budget{s.c, cfg.budget});
        if (static_cast<int>(plan.heads.size()) != g.n_kv_heads) {
          compress = true;
        } else {
          for (const HeadPlan& hp : plan.heads)
            if (hp.kept() != s.c)
              throw Error("policy " + cfg.policy + ": dropped " + std::to_string(s.c - hp.kept()) +
                          " tokens with a budget that fits the whole cache (" + std::to_string(s.c) + " tokens)");
        }
      } else if (compress) {
        plan = cfg.impl->compress(signals, Budget{out.budget.tokens, cfg.budget});
      }
      if (compress) {
        const bool per_q = static_cast<int>(plan.heads.size()) == g.n_q_heads && g.n_q_heads != g.n_kv_heads;
        if (static_cast<int>(plan.heads.size()) != g.n_kv_heads && !per_q)
          throw Error("policy " + cfg.policy + ": plan has " + std::to_string(plan.heads.size()) + " heads, expected " +
                      std::to_string(g.n_kv_heads) + " or " + std::to_string(g.n_q_heads));
        std::vector<std::vector<std::int32_t>> keep(plan.heads.size());
        for (std::size_t e = 0; e < plan.heads.size(); ++e) {
          const auto tokens = signals.cached(static_cast<int>(per_q ? e / static_cast<std::size_t>(g.group()) : e));
          const auto& codec = plan.heads[e].codec;
          if (codec.size() != tokens.size())
            throw Error("policy " + cfg.policy + ": plan covers " + std::to_string(codec.size()) + " tokens, expected " +
                        std::to_string(tokens.size()));
          for (std::size_t m = 0; m < codec.size(); ++m) {
            if (!codec_supported(codec[m]) && !cfg.impl->codec())
              throw Error("policy " + cfg.policy + ": plan encodes tokens as " + codec_name(codec[m]) +
                          ", but the policy names no codec to store them");
            if (codec[m] != TokenCodec::Drop) keep[e].push_back(tokens[m]);
          }
        }
        model.cache().keep(l, keep, g.n_q_heads);
        entries = static_cast<std::int64_t>(plan.heads.size());
        const std::vector<KvEntry> before_codec = cfg.impl->codec() ? model.cache().layers[static_cast<std::size_t>(l)]
                                                                      : std::vector<KvEntry>{};
        // Encoded tokens: the cache now holds what their codec reads back, at the codec's bytes.
        for (std::size_t e = 0; e < plan.heads.size(); ++e) {
          if (!needs_codec(plan.heads[e])) continue;
          KvEntry& entry = model.cache().layers[static_cast<std::size_t>(l)][e];
          std::vector<std::int32_t> positions;
          for (auto t : entry.tokens) positions.push_back(s.header.positions[static_cast<std::size_t>(t)]);
          entry.packed = model.holds_packed() ? packed_form(cfg.impl->codec(), plan.heads[e], g, positions, entry) : nullptr;
          cfg.impl->codec()->reconstruct(plan.heads[e], g, positions, entry.k, entry.v);
          codec_saving += static_cast<double>(entry.rows()) * out.budget.kv_token_bytes - cfg.impl->codec()->bytes(plan.heads[e], g.head_dim);
        }
        out.states[static_cast<std::size_t>(l)] = cfg.impl->start_decode(signals, plan, Budget{out.budget.tokens, cfg.budget});
        if (out.states[static_cast<std::size_t>(l)]) {
          if (per_q) throw Error("policy " + cfg.policy + ": per-query-head plans with decode-time eviction are not supported");
          out.any_state = true;
          if (cfg.impl->codec()) {
            out.originals.resize(static_cast<std::size_t>(g.n_layers));
            out.originals[static_cast<std::size_t>(l)] = before_codec;
          }
        }
      }
      std::vector<std::vector<std::int32_t>> kept;
      for (const KvEntry& e : model.cache().layers[static_cast<std::size_t>(l)]) kept.push_back(e.tokens);
      res.kept.push_back(std::move(kept));
    }
    // Rules start once every layer is compressed: they apply to the cache the next pass loads.
    out.in_engine.assign(static_cast<std::size_t>(g.n_layers), false);
    for (int l = 0; l < g.n_layers; ++l) {
      const DecodeState* state = out.states[static_cast<std::size_t>(l)].get();
      if (!state) continue;
      const bool tiered = !out.originals.empty() && !out.originals[static_cast<std::size_t>(l)].empty();
      std::optional<DecodeRuleStart> rule;
      if (opts.rules_in_engine && model.runs_decode_rules() && !tiered) rule = state->rule();
      if (rule) {
        model.start_decode_rule(l, *rule);
        out.in_engine[static_cast<std::size_t>(l)] = true;
        out.any_in_engine = true;
      } else if (state->needs_attention()) {
        out.host_weights = true;
      }
    }
    res.policy_steps = !out.any_state ? "none" : out.any_in_engine ? "engine" : "host";
    const auto rows = static_cast<double>(std::as_const(model).cache().entries_rows());
    res.compressed_bytes = cache_bytes(out.budget, rows, entries, g.n_layers) - codec_saving;
    res.budget_bytes = cfg.budget * static_cast<double>(s.c) * g.n_layers * g.n_kv_heads * out.budget.kv_token_bytes;
    res.kept_fraction = rows / (static_cast<double>(g.n_layers) * g.n_kv_heads * static_cast<double>(s.c));
    return out;
  }

  // One token on the compressed cache, then decode-time eviction in every layer that has a
  // state (the token has joined and its query attended, as in replay).
  std::vector<float> step(std::int32_t token, Compressed& cs, const std::string& label) {
    model.record_last_attention(cs.host_weights);
    std::vector<float> logits = model.step(token);
    if (!cs.any_state) return logits;
    const auto t = model.cached_tokens() - 1;
    // An eviction policy's cache fits its budget after every step (a protected window may not let it).
    auto check_budget = [&](const KvEntry& entry) {
      if (entry.rows() > std::max<std::int64_t>(cs.budget.tokens, 0))
        throw Error("policy " + label + ": cache holds " + std::to_string(entry.rows()) + " tokens after step " +
                    std::to_string(t) + ", over its budget of " + std::to_string(cs.budget.tokens));
    };
    if (cs.any_in_engine) {
      model.decode_rule_step(cs.budget.tokens);  // the evicted tokens have left the cache already
      for (int l = 0; l < g.n_layers; ++l)
        if (cs.in_engine[static_cast<std::size_t>(l)])
          for (const KvEntry& entry : std::as_const(model).cache().layers[static_cast<std::size_t>(l)]) check_budget(entry);
    }
    for (int l = 0; l < g.n_layers; ++l) {
      DecodeState* state = cs.states[static_cast<std::size_t>(l)].get();
      if (!state || cs.in_engine[static_cast<std::size_t>(l)]) continue;
      // Reads go through the const cache: a mutable access marks the CUDA engine's mirror edited.
      const auto& layer = std::as_const(model).cache().layers[static_cast<std::size_t>(l)];
      std::vector<std::vector<std::int32_t>> cache;
      for (const KvEntry& e : layer) cache.push_back(e.tokens);
      std::vector<std::vector<float>> weights(static_cast<std::size_t>(g.n_q_heads));
      if (state->needs_attention())
        for (int hq = 0; hq < g.n_q_heads; ++hq) {
          const auto w = model.last_attention(l, hq);
          weights[static_cast<std::size_t>(hq)].assign(w.begin(), w.end());
        }
      std::vector<std::vector<std::int32_t>> evict(static_cast<std::size_t>(g.n_kv_heads));
      state->step(DecodeStep{t, cache, weights, cs.budget.tokens}, evict);
      const bool tiered = !cs.originals.empty() && !cs.originals[static_cast<std::size_t>(l)].empty();
      for (int kv = 0; kv < g.n_kv_heads; ++kv) {
        const auto kvi = static_cast<std::size_t>(kv);
        if (tiered) {  // the new token's rows are original (fp16): the host copy gets them too
          KvEntry& orig = cs.originals[static_cast<std::size_t>(l)][kvi];
          const KvEntry& live = layer[kvi];
          const auto row = static_cast<std::ptrdiff_t>((live.tokens.size() - 1) * static_cast<std::size_t>(g.head_dim));
          orig.tokens.push_back(live.tokens.back());
          orig.k.insert(orig.k.end(), live.k.begin() + row, live.k.end());
          orig.v.insert(orig.v.end(), live.v.begin() + row, live.v.end());
        }
        model.evict(l, kv, evict[kvi]);  // on the device too, with the CUDA engine
        if (!tiered) check_budget(layer[kvi]);
      }
      if (!tiered) continue;
      KvCache host;
      host.head_dim = g.head_dim;
      host.layers = {std::move(cs.originals[static_cast<std::size_t>(l)])};
      for (int kv = 0; kv < g.n_kv_heads; ++kv) host.evict(0, kv, evict[static_cast<std::size_t>(kv)]);
      cs.originals[static_cast<std::size_t>(l)] = std::move(host.layers[0]);
      retier(l, t, *state, cs, label);
    }
    return logits;
  }

  // A re-tiering policy's new encoding of layer l after step t: every kept token re-encoded from
  // its original rows (promotion restores fp16 exactly), Drop tokens leave both copies.
  void retier(int l, std::int64_t t, DecodeState& state, Compressed& cs, const std::string& label) {
    auto& layer = model.cache().layers[static_cast<std::size_t>(l)];
    std::vector<std::vector<std::int32_t>> cache;
    for (const KvEntry& e : layer) cache.push_back(e.tokens);
    LayerPlan next;
    if (!state.retier(DecodeStep{t, cache, {}, cs.budget.tokens}, next)) return;
    if (static_cast<int>(next.heads.size()) != g.n_kv_heads)
      throw Error("policy " + label + ": re-tier plan has " + std::to_string(next.heads.size()) + " heads, expected " +
                  std::to_string(g.n_kv_heads));
    std::vector<std::vector<std::int32_t>> keep(next.heads.size());
    std::vector<HeadPlan> kept_plans(next.heads.size());
    for (std::size_t kv = 0; kv < next.heads.size(); ++kv) {
      const HeadPlan& hp = next.heads[kv];
      if (hp.codec.size() != cache[kv].size())
        throw Error("policy " + label + ": re-tier plan covers " + std::to_string(hp.codec.size()) + " tokens, expected " +
                    std::to_string(cache[kv].size()));
      for (std::size_t m = 0; m < hp.codec.size(); ++m) {
        if (hp.codec[m] == TokenCodec::Drop) continue;
        keep[kv].push_back(cache[kv][m]);
        kept_plans[kv].codec.push_back(hp.codec[m]);
        if (!hp.rank.empty()) kept_plans[kv].rank.push_back(hp.rank[m]);
      }
    }
    KvCache host;
    host.head_dim = g.head_dim;
    host.layers = {std::move(cs.originals[static_cast<std::size_t>(l)])};
    host.keep(0, keep, g.n_q_heads);
    cs.originals[static_cast<std::size_t>(l)] = host.layers[0];
    const KvCodec* codec = cs.codec;
    const double budget = cs.fraction * static_cast<double>(cs.c) * cs.budget.kv_token_bytes;
    for (std::size_t kv = 0; kv < next.heads.size(); ++kv) {
      KvEntry& entry = layer[kv];
      entry = host.layers[0][kv];
      std::vector<std::int32_t> positions;
      for (auto token : entry.tokens) positions.push_back((*cs.positions)[static_cast<std::size_t>(token)]);
      entry.packed = model.holds_packed() ? packed_form(codec, kept_plans[kv], g, positions, entry) : nullptr;
      codec->reconstruct(kept_plans[kv], g, positions, entry.k, entry.v);
      if (codec->bytes(kept_plans[kv], g.head_dim) > budget + 1e-6)
        throw Error("policy " + label + ": re-tiered cache of layer " + std::to_string(l) + ", KV head " + std::to_string(kv) +
                    " holds " + std::to_string(codec->bytes(kept_plans[kv], g.head_dim)) + " bytes after step " +
                    std::to_string(t) + ", over its budget of " + std::to_string(budget));
    }
  }

  // The question tokens after a query-agnostic compression point; returns the last logits (or
  // the prefill's, query-aware).
  std::vector<float> run_question(Shared& s, Compressed& cs, const std::string& label) {
    std::vector<float> logits = s.prefill_logits;
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
      const bool affected = j > 0 || opts.mode == ReplayMode::QueryAgnostic;
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
    for (const auto& layer : std::as_const(model).cache().layers) {
      res.final_kept.emplace_back();
      for (const KvEntry& e : layer) res.final_kept.back().push_back(e.tokens);
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
  return o;
}

}  // namespace

LiveVerifier::LiveVerifier(const GgufFile& gguf, VerifyOptions opts)
    : impl_(std::make_unique<Impl>(gguf, checked(opts), nullptr)) {}

LiveVerifier::LiveVerifier(const GgufFile& gguf, VerifyOptions opts, std::unique_ptr<Engine> engine)
    : impl_(std::make_unique<Impl>(gguf, checked(opts), std::move(engine))) {}

LiveVerifier::~LiveVerifier() = default;

KvGeometry LiveVerifier::geometry() const { return impl_->g; }

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
    if (j == 0 && impl_->opts.mode == ReplayMode::QueryAware) continue;
    nll -= s.ref_logp[j][static_cast<std::size_t>(s.reference[j])];
    ++steps;
  }
  out.reference_ppl = steps ? std::exp(nll / static_cast<double>(steps)) : 1;
  out.shared_seconds = since(t0);
  for (const ReplayConfig& cfg : configs) out.configs.push_back(impl_->run_config(s, cfg, expected));
  return out;
}

}  // namespace kvsim
