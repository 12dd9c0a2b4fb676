// The per-request full-cache run every config of a live verify shares: prefill, reference
// continuation, oracle signal and the signals policies read.
#include "verify/live_verifier_impl.h"

#include <algorithm>
#include <cmath>

namespace kvsim {

using namespace live_detail;

LiveVerifier::Impl::Shared LiveVerifier::Impl::prefill(const CaptureRequest& r, bool with_repeat) {
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
  for (const auto& [b, e] : prefill_chunks(s.c, prompt_splits(s.p), opts.prefill_chunk)) {
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

void LiveVerifier::Impl::prefill_range(const Shared& s, std::int64_t b, std::int64_t e,
                                       std::vector<FloatBuffer>& queries, std::vector<float>& last_logits) {
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
  auto logits =
      model.forward(std::span(s.p.tokens).subspan(static_cast<std::size_t>(b), static_cast<std::size_t>(e - b)), pos,
                    want ? std::span<const std::int64_t>(&last, 1) : std::span<const std::int64_t>(), hook);
  if (want) last_logits = std::move(logits);
}

void LiveVerifier::Impl::reference_run(Shared& s) {
  const ModelConfig& c = model.config();
  const auto q_row = static_cast<std::size_t>(c.n_q_heads) * static_cast<std::size_t>(c.head_dim);
  s.eval_queries.assign(static_cast<std::size_t>(c.n_layers), {});
  auto hook = [&](const LayerActivations& a) {
    append_rounded(s.eval_queries[static_cast<std::size_t>(a.layer)], a.q.data(),
                   static_cast<std::size_t>(a.n) * q_row);
  };
  model.set_cache(s.at_point);
  std::vector<float> logits = s.prefill_logits;
  for (std::int64_t t = s.c; t < s.n_prompt; ++t) {
    s.eval_tokens.push_back(t);
    logits = model.step(s.p.tokens[static_cast<std::size_t>(t)], hook);
  }
  for (int j = 0; j < opts.max_new; ++j) {
    const std::int32_t next = tok.greedy_next(logits, j >= opts.min_new);
    s.reference.push_back(next);
    s.ref_logp.push_back(log_softmax(logits));
    s.eval_tokens.push_back(model.cached_tokens());
    logits = model.step(next, hook);
    if (tok.is_eog(next)) break;
  }
  s.final_cache = std::as_const(model).cache();
  s.future.assign(static_cast<std::size_t>(c.n_layers), std::nullopt);
}

const std::vector<Mat>& LiveVerifier::Impl::future_attention(Shared& s, int layer) {
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
    out[static_cast<std::size_t>(hq)] = std::move(a);  // every token: a re-applied policy holds later ones too
  }
  slot = std::move(out);
  return *slot;
}

std::unique_ptr<CacheView> LiveVerifier::Impl::live_view(Shared& s, int layer, const std::vector<KvEntry>& entries,
                                                         bool at_cut) {
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

const CacheSignals& LiveVerifier::Impl::signals_at(Shared& s, int layer) {
  if (s.signals.empty()) {
    s.views.resize(static_cast<std::size_t>(g.n_layers));
    s.signals.resize(static_cast<std::size_t>(g.n_layers));
  }
  auto& slot = s.signals[static_cast<std::size_t>(layer)];
  if (slot) return *slot;
  s.views[static_cast<std::size_t>(layer)] = live_view(s, layer, s.at_point.layers[static_cast<std::size_t>(layer)]);
  slot = std::make_unique<CacheSignals>(s.where, g, layer, s.c, tokens_of(s.header),
                                        s.queries[static_cast<std::size_t>(layer)],
                                        *s.views[static_cast<std::size_t>(layer)]);
  return *slot;
}

std::vector<std::int32_t> LiveVerifier::Impl::strip_eos(std::vector<std::int32_t> ids) const {
  if (!ids.empty() && tok.is_eog(ids.back())) ids.pop_back();
  return ids;
}

}  // namespace kvsim
