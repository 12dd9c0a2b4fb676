// Each config of a live verify: its cache compressed through kvcache/'s plan API (cuts
// included), stepped with decode-time eviction, and scored against the full-cache run.
#include "verify/live_verifier_impl.h"
#include "kvcache/training_prompts.h"
#include "policies/registry.h"

#include <algorithm>
#include <cmath>

namespace kvsim {

using namespace live_detail;

void LiveVerifier::Impl::prefill_with_cuts(Shared& s, const ReplayConfig& cfg, Compressed& cs,
                                           const std::vector<std::int64_t>& cuts, const std::vector<bool>& compresses) {
  model.reset();
  model.reserve(s.n_prompt + opts.max_new);
  model.record_last_attention(false);
  cs.queries.assign(static_cast<std::size_t>(g.n_layers), {});
  for (auto& index : cs.index) index = LayerIndex::prefix(g.n_kv_heads, 0);
  std::vector<std::int64_t> splits = cuts;
  for (const std::int64_t split : prompt_splits(s.p)) splits.push_back(split);
  for (const auto& [b, e] : prefill_chunks(s.c, splits, opts.prefill_chunk)) {
    prefill_range(s, b, e, cs.queries, cs.prefill_logits);
    for (auto& index : cs.index)
      for (std::int64_t j = b; j < e; ++j) kvcache::append_token(index, static_cast<std::int32_t>(j));
    if (e == s.c || std::find(cuts.begin(), cuts.end(), e) == cuts.end()) continue;
    const std::int64_t at = e;  // (a structured binding: not capturable by a lambda in C++17 clang)
    for (int l = 0; l < g.n_layers; ++l) {
      const auto li = static_cast<std::size_t>(l);
      if (!compresses[li]) continue;
      kvcache::cut_if_over(cfg, cs.budget, cs.index[li], cs.rows[li].get(), [&](const auto& f) {
        const auto view = live_view(s, l, std::as_const(model).cache().layers[li], true);
        f(CacheSignals(s.where, g, l, at, tokens_of(s.header), cs.queries[li], *view));
      });
    }
  }
}

LiveVerifier::Impl::Compressed LiveVerifier::Impl::compress(Shared& s, const ReplayConfig& cfg, LiveConfigResult& res,
                                                            const KvCache* start) {
  const auto L = static_cast<std::size_t>(g.n_layers);
  Compressed out;
  // Sliding-window layers hold their window; the budget's rest goes to the global layers.
  check_window_support(g, *cfg.impl, cfg.label(), s.where);
  check_window_peak(g, opts.budget_rule, s.c, s.where);
  const WindowShare windows = window_share(g, s.c);
  const double global = global_fraction(cfg.budget, windows, s.c, cfg.label());
  out.budget = config_budget(*cfg.impl, global, s.c, g.head_dim, opts.budget_rule, cfg.label());
  out.codec = cfg.impl->codec();
  out.entry_budget = global * static_cast<double>(s.c) * out.budget.kv_token_bytes;
  out.index.resize(L);
  out.states.resize(L);
  out.prefill_logits = s.prefill_logits;
  out.segments = s.header.segments;
  res.budget_tokens = out.budget.tokens;
  std::vector<bool> compresses(L);
  for (std::size_t l = 0; l < L;
       ++l)  // (a compressing budget needs no signals to say so; a local layer never compresses)
    compresses[l] =
        g.window(static_cast<int>(l)) == 0 &&
        (out.budget.compress || kvcache::needs_compression(cfg, out.budget, signals_at(s, static_cast<int>(l))));
  for (int l = 0; l < g.n_layers; ++l)
    out.rows.push_back(std::make_unique<EngineRows>(model, l, g, out.codec, s.header.positions));
  const std::vector<std::int64_t> cuts = compression_cuts(s.c, opts.compress_every);
  const bool chunked = cuts.size() > 1 && std::find(compresses.begin(), compresses.end(), true) != compresses.end();
  if (cfg.impl->selects_across_layers() && out.budget.compress) {  // one selection over every layer
    kvcache::check_no_cuts_across_layers(cfg, cuts.size());
    std::vector<std::shared_ptr<const void>> summaries;
    for (int l = 0; l < g.n_layers; ++l) summaries.push_back(cfg.impl->layer_summary(signals_at(s, l)));
    out.budget.across_layers = cfg.impl->select_across_layers(summaries, out.budget.policy_budget());
  }
  if (chunked) {
    if (start) throw Error(s.where + ": chunk reuse and --compress-every cannot be combined");
    prefill_with_cuts(s, cfg, out, cuts, compresses);
  } else {
    model.set_cache(start ? *start : s.at_point);
    for (auto& index : out.index) index = LayerIndex::prefix(g.n_kv_heads, s.c);
  }
  out.q_index = s.header.q_index;
  for (int l = 0; l < g.n_layers; ++l) {
    const auto li = static_cast<std::size_t>(l);
    if (compresses[li]) compress_layer(s, cfg, out, l, chunked);
    check_mirror(model, l, out.index[li], cfg.label());
    res.kept.push_back(held_tokens(l, out.index[li]));
  }
  start_rules(out);
  res.policy_steps = !out.any_state ? "none" : out.any_in_engine ? "engine" : "host";
  double bytes = 0, rows = 0;
  for (int l = 0; l < g.n_layers; ++l) {
    const LayerIndex& index = out.index[static_cast<std::size_t>(l)];
    bytes += layer_held_bytes(l, index, out);
    rows += static_cast<double>(held_rows(l, index));
  }
  res.compressed_bytes = bytes;
  out.peak_bytes = bytes;
  if (out.reapplies && !chunked) out.queries = s.queries;  // the config's own queries join them
  const double full_rows = static_cast<double>(windows.held_tokens) * g.n_kv_heads;
  res.budget_bytes = cfg.budget * full_rows * out.budget.kv_token_bytes;
  res.kept_fraction = rows / full_rows;
  res.position_fallback = out.fallback.share();
  return out;
}

void LiveVerifier::Impl::compress_layer(Shared& s, const ReplayConfig& cfg, Compressed& out, int l, bool chunked) {
  const auto li = static_cast<std::size_t>(l);
  std::unique_ptr<CacheView> own_view;
  std::unique_ptr<CacheSignals> own;
  if (chunked) {
    own_view = live_view(s, l, std::as_const(model).cache().layers[li], true);
    own = std::make_unique<CacheSignals>(s.where, g, l, s.c, tokens_of(s.header), out.queries[li], *own_view);
  }
  const CacheSignals& signals = chunked ? *own : signals_at(s, l);
  const LayerPlan plan = kvcache::make_plan(cfg, out.budget, signals, out.index[li].sizes(), chunked);
  out.fallback.add(plan);
  EngineRows& rows = *out.rows[li];
  if (out.codec) rows.keep_originals();
  kvcache::apply_plan(cfg, plan, g, out.index[li], &rows);
  kvcache::DecodeStart started =
      kvcache::decode_start(cfg, out.budget, plan, cfg.impl->start_decode(signals, plan, out.budget.policy_budget()),
                            s.c, g.n_kv_heads, g.head_dim);
  out.states[li] = std::move(started.state);
  out.reapplies = out.reapplies || started.reapplied;  // peak semantics: a one-shot rule re-applies
  if (out.states[li]) {
    out.any_state = true;
  } else {
    rows.drop_originals();  // a one-shot codec never re-encodes
  }
}

void LiveVerifier::Impl::start_rules(Compressed& out) {
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

double LiveVerifier::Impl::layer_held_bytes(int layer, const LayerIndex& index, const Compressed& cs) const {
  if (g.window(layer) == 0) return kvcache::layer_bytes(index, cs.budget, cs.codec, g.head_dim);
  return static_cast<double>(held_rows(layer, index)) * cs.budget.kv_token_bytes;
}

std::int64_t LiveVerifier::Impl::held_rows(int layer, const LayerIndex& index) const {
  const std::int64_t w = g.window(layer);
  std::int64_t rows = 0;
  for (const std::int64_t n : index.sizes()) rows += w > 0 ? std::min(n, w) : n;
  return rows;
}

std::vector<std::vector<std::int32_t>> LiveVerifier::Impl::held_tokens(int layer, const LayerIndex& index) const {
  std::vector<std::vector<std::int32_t>> out = index.tokens;
  if (const std::int64_t w = g.window(layer); w > 0)
    for (auto& entry : out)
      if (static_cast<std::int64_t>(entry.size()) > w) entry.erase(entry.begin(), entry.end() - w);
  return out;
}

double LiveVerifier::Impl::held_bytes(const Compressed& cs) const {
  double bytes = 0;
  for (int l = 0; l < g.n_layers; ++l) bytes += layer_held_bytes(l, cs.index[static_cast<std::size_t>(l)], cs);
  return bytes;
}

std::shared_ptr<const LayerSignals> LiveVerifier::Impl::signals_now(Shared& s, Compressed& cs, int layer,
                                                                    std::int64_t n) {
  const EngineRows& rows = *cs.rows[static_cast<std::size_t>(layer)];
  struct Held {
    std::unique_ptr<CacheView> view;
    std::optional<CacheSignals> signals;
  };
  auto held = std::make_shared<Held>();
  held->view = live_view(
      s, layer,
      rows.has_originals() ? rows.originals() : std::as_const(model).cache().layers[static_cast<std::size_t>(layer)],
      true);
  held->signals.emplace(s.where, g, layer, n, kvcache::RequestTokens{s.header.positions, s.header.segments, cs.q_index},
                        cs.queries[static_cast<std::size_t>(layer)], *held->view);
  return std::shared_ptr<const LayerSignals>(held, &*held->signals);
}

std::vector<float> LiveVerifier::Impl::step(Shared& s, std::int32_t token, Compressed& cs, const std::string& label) {
  model.record_last_attention(cs.host_weights);
  LayerHook hook;
  if (cs.reapplies) {  // a re-applied rule reads this config's own queries, as a trace records them
    const auto q_row = static_cast<std::size_t>(g.n_q_heads) * static_cast<std::size_t>(g.head_dim);
    hook = [&cs, q_row](const LayerActivations& a) {
      append_rounded(cs.queries[static_cast<std::size_t>(a.layer)], a.q.data(), static_cast<std::size_t>(a.n) * q_row);
    };
  }
  std::vector<float> logits = model.step(token, hook);
  const auto t = static_cast<std::int32_t>(model.cached_tokens() - 1);
  for (LayerIndex& index : cs.index) kvcache::append_token(index, t);
  if (cs.reapplies) cs.q_index.push_back(t);
  cs.peak_bytes = std::max(cs.peak_bytes, held_bytes(cs));  // the token has joined; nothing evicted yet
  if (!cs.any_state) return logits;
  // An eviction policy's cache fits its budget after every step (a protected window may not let it).
  const std::int64_t max_rows = cs.budget.rows_after_step();
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
    const int segment = static_cast<std::size_t>(t) < cs.segments.size() ? cs.segments[static_cast<std::size_t>(t)]
                                                                         : static_cast<int>(Segment::Generated);
    const std::function<std::shared_ptr<const LayerSignals>()> signals = [&, l] {
      return signals_now(s, cs, l, t + 1);
    };
    DecodeStep before{t, index.tokens, weights, cs.budget.tokens, segment};
    before.signals = &signals;
    state->step(before, evict);
    kvcache::apply_evictions(label, evict, t, tiered ? -1 : max_rows, index, &rows);
    LayerPlan next;
    DecodeStep after{t, index.tokens, {}, cs.budget.tokens};
    after.signals = &signals;
    if (tiered && state->retier(after, next))
      kvcache::apply_retier(label, next, l, t, *cs.codec, cs.entry_budget, g.head_dim, index, &rows);
  }
  return logits;
}

std::vector<float> LiveVerifier::Impl::run_question(Shared& s, Compressed& cs, const std::string& label) {
  std::vector<float> logits = cs.prefill_logits;
  for (std::int64_t t = s.c; t < s.n_prompt; ++t) logits = step(s, s.p.tokens[static_cast<std::size_t>(t)], cs, label);
  return logits;
}

LiveConfigResult LiveVerifier::Impl::run_config(Shared& s, const ReplayConfig& cfg,
                                                const std::vector<std::string>& expected, const KvCache* start) {
  const auto t0 = Clock::now();
  LiveConfigResult res;
  Compressed cs = compress(s, cfg, res, start);
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
      res.step_kl.push_back(kl);
      res.step_query.push_back(s.n_prompt - 1 + static_cast<std::int64_t>(j));
      res.max_kl = std::max(res.max_kl, kl);
      nll_sum -= lq[static_cast<std::size_t>(s.reference[j])];
      const bool same = argmax(logits) == s.reference[j];
      top1 += same ? 1 : 0;
      if (!same && diverged == len) diverged = j;
      ++res.steps;
    }
    if (j + 1 < len) logits = step(s, s.reference[j], cs, cfg.label());
  }
  res.decode_peak_bytes = cs.peak_bytes;
  kvcache::check_peak_bytes(cfg, cs.budget, res.decode_peak_bytes, res.budget_bytes, s.where);
  res.final_rows = 0;
  for (int l = 0; l < g.n_layers; ++l) {
    const LayerIndex& index = cs.index[static_cast<std::size_t>(l)];
    check_mirror(model, l, index, cfg.label());  // the engine's rows are the index's
    res.final_rows += held_rows(l, index);
    res.final_kept.push_back(held_tokens(l, index));
  }
  const auto n = static_cast<double>(res.steps);
  res.mean_kl = res.steps ? kl_sum / n : 0;
  res.top1 = res.steps ? top1 / n : 1;
  res.ppl = res.steps ? std::exp(nll_sum / n) : 1;
  // Free-running: identical to the reference until the first divergent prediction, so only a
  // divergent config pays for a second run.
  std::vector<std::int32_t> generated = s.reference;
  if (diverged < len && !opts.free_run) {  // a divergent prediction: the free run differs, unscored
    res.same_tokens = false;
    res.task_score = std::nan("");
    res.seconds = since(t0);
    return res;
  }
  if (diverged < len) {
    res.kept.clear();
    cs = compress(s, cfg, res, start);
    logits = run_question(s, cs, cfg.label());
    generated.clear();
    for (int j = 0; j < opts.max_new; ++j) {
      const std::int32_t next = tok.greedy_next(logits, j >= opts.min_new);
      generated.push_back(next);
      if (tok.is_eog(next)) break;
      if (j + 1 < opts.max_new) logits = step(s, next, cs, cfg.label());
    }
    for (int l = 0; l < g.n_layers; ++l) check_mirror(model, l, cs.index[static_cast<std::size_t>(l)], cfg.label());
  }
  res.same_tokens = generated == s.reference;
  res.generated = tok.decode(strip_eos(generated));
  res.task_score = task_score(res.generated, expected);
  res.seconds = since(t0);
  return res;
}
LiveConfigResult LiveVerifier::Impl::run_reuse(Shared& s, const ReuseConfig& way,
                                               const std::vector<std::string>& expected) {
  const auto t0 = Clock::now();
  ReuseStats stats;
  const KvCache start = chunk_states.serve(s.p, s.c, s.at_point, way, stats, s.where);
  const double serve_seconds = since(t0);
  static const auto full = std::shared_ptr<const Policy>(PolicyRegistry::instance().create("full").policy);
  LiveConfigResult res = run_config(s, ReplayConfig{"full", "", full, 1.0}, expected, &start);
  res.seconds += serve_seconds;
  return res;
}

namespace {

const VerifyOptions& checked(const VerifyOptions& o) {
  if (o.max_new < 2) throw Error("--max-new must be >= 2 (the first continuation token is not affected query-aware)");
  if (o.min_new < 0 || o.min_new > o.max_new)
    throw Error("--min-new is " + std::to_string(o.min_new) + "; expected 0 to --max-new (" +
                std::to_string(o.max_new) + ")");
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

LiveRequestResult LiveVerifier::run(const CaptureRequest& request, const std::vector<ReplayConfig>& configs,
                                    const std::vector<ReuseConfig>& reuse) {
  const auto t0 = Clock::now();
  if (!reuse.empty() && (request.chunks.empty() || impl_->opts.mode != ReplayMode::QueryAgnostic))
    throw Error("request " + request.id + ": --chunk-reuse needs chunked requests (field 'chunks') and " +
                "--mode query-agnostic (chunks are reused before the question arrives)");
  Impl::Shared s = impl_->prefill(request, std::any_of(configs.begin(), configs.end(), [](const ReplayConfig& c) {
                                    return c.impl->needs_repeat_pass();
                                  }));
  kvcache::check_training_prompts(configs, s.p.tokens, s.where, impl_->opts.allow_training_requests);
  s.with_future =
      std::any_of(configs.begin(), configs.end(), [](const ReplayConfig& c) { return c.impl->reads_future(); });
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
  for (const ReuseConfig& way : reuse) out.configs.push_back(impl_->run_reuse(s, way, expected));
  return out;
}

}  // namespace kvsim
