#include <algorithm>
#include <bit>
#include <cmath>

#include "core/error.h"
#include "policies/codec.h"
#include "kvcache/reapply.h"
#include "core/event_queue.h"
#include "sim/replay_internal.h"

namespace kvsim::replay_detail {

namespace {

struct LayerDecision {
  LayerPlan plan;  // one codec per token of [0, c) per entry; tokens dropped earlier are Drop
  std::unique_ptr<DecodeState> state;
};

// The policy's decision for one layer at the compression point c, with the cache size at every
// prefill step added to `a`. With --compress-every the policy also cuts the cache at every cut
// where it exceeds the budget (dropping only: encodings apply at c), and sees only what survived
// earlier cuts. The plans go through kvcache/, as live verify's do.
LayerDecision decide(const ReplayConfig& cfg, const ConfigBudget& b, const LayerWork& w, Accumulator& a) {
  const int Hkv = w.g.n_kv_heads, G = w.g.group();
  const std::int64_t c = w.c;
  const Budget budget = b.policy_budget();
  const std::vector<std::int64_t> cuts = compression_cuts(c, w.compress_every);
  LayerDecision d;
  if (cuts.size() == 1) {
    d.plan = kvcache::make_plan(cfg, b, w.signals, std::vector<std::int64_t>(static_cast<std::size_t>(Hkv), c));
    a.fallback.add(d.plan);
    d.state = cfg.impl->start_decode(w.signals, d.plan, budget);
    for (std::int64_t t = 0; t < c; ++t)
      a.prefill_size[static_cast<std::size_t>(t)] += static_cast<double>((t + 1) * Hkv);
    return d;
  }
  kvcache::LayerIndex cache = kvcache::LayerIndex::prefix(Hkv, 0);
  std::int64_t prev = 0;
  // The prefill on the token-step clock: at each cut the tokens since the last one join the
  // cache first, then the policy may cut it (same time, lower priority value first).
  enum Priority { kJoin = 0, kCut = 1 };
  EventQueue<std::int64_t> clock;
  auto join = [&](std::int64_t cut) {
    for (std::int64_t j = prev; j < cut; ++j) {
      kvcache::append_token(cache, static_cast<std::int32_t>(j));
      for (const auto& t : cache.tokens) a.prefill_size[static_cast<std::size_t>(j)] += static_cast<double>(t.size());
    }
    prev = cut;
  };
  auto with_signals = [&](std::int64_t at, const auto& f) {
    const CacheView view = gather_view(cache.tokens, w.full_k, w.full_v, w.attn, G);
    f(CacheSignals(w.where, w.g, w.layer, at, w.tokens, w.q, view));
  };
  auto cut = [&](std::int64_t at) {
    if (at < c) {
      kvcache::cut_if_over(cfg, b, cache, nullptr, [&](const auto& f) { with_signals(at, f); });
      return;
    }
    with_signals(at, [&](const LayerSignals& signals) {
      const LayerPlan plan = kvcache::make_plan(cfg, b, signals, cache.sizes(), true);
      a.fallback.add(plan);
      d.state = cfg.impl->start_decode(signals, plan, budget);
      d.plan = kvcache::widen_plan(plan, cache, c);
    });
  };
  for (const std::int64_t at : cuts) {
    clock.schedule(at, kJoin, [&, at] { join(at); });
    clock.schedule(at, kCut, [&, at] { cut(at); });
  }
  clock.run();
  return d;
}

}  // namespace

// Phase A of a layer, for one config: asks the policy for its plan. Decode-time configs are
// replayed entirely here; uncompressed ones record exact rows; one-shot ones return their
// keep-sets for the shared phase B, encoded ones their plans for scoring after phase A.
static Planned plan_config_unchecked(std::size_t index, const ReplayConfig& cfg, const ConfigBudget& budget,
                                     const LayerWork& w, Accumulator& a) {
  const int Hkv = w.g.n_kv_heads;
  const std::int64_t c = w.c;
  if (!kvcache::needs_compression(cfg, budget, w.signals)) {  // the full cache: exact by definition
    if (w.record_keep_sets) a.kept_sets[static_cast<std::size_t>(w.layer)] = kvcache::LayerIndex::prefix(Hkv, c).tokens;
    for (int kv = 0; kv < Hkv; ++kv) a.mix(static_cast<std::uint64_t>(c));
    a.kept += c * Hkv;
    for (std::int64_t t = 0; t < c; ++t)
      a.prefill_size[static_cast<std::size_t>(t)] += static_cast<double>((t + 1) * Hkv);
    for (std::int64_t i = 0; i < w.T - c; ++i)
      a.kept_after_step[static_cast<std::size_t>(i)] += static_cast<double>((c + i + 1) * Hkv);
    for (int qh = 0; qh < w.g.n_q_heads; ++qh)
      for (std::int64_t i = 0; i < w.E; ++i) a.add_row(w.layer, qh, i, 1.0, 0.0, 0.0);
    return {};
  }
  const int G = w.g.group();
  LayerDecision d = decide(cfg, budget, w, a);
  const LayerPlan& plan = d.plan;
  kvcache::refuse_logit_bias_offline(cfg, plan);
  if (w.record_keep_sets) {
    kvcache::LayerIndex kept = kvcache::LayerIndex::prefix(Hkv, c);
    kvcache::apply_plan(cfg, plan, w.g, kept, nullptr);
    a.kept_sets[static_cast<std::size_t>(w.layer)] = std::move(kept.tokens);
  }
  const bool per_query_head = static_cast<int>(plan.heads.size()) != Hkv;
  // Peak semantics: a one-shot policy re-applies its rule as the cache grows, stepped as a
  // decode-time policy is.
  d.state = kvcache::decode_start(cfg, budget, plan, std::move(d.state), c, Hkv, w.g.head_dim).state;
  if (d.state) {
    a.entries = Hkv;
    if (cfg.impl->codec())
      replay_codec_decode(cfg, budget, w, plan, *d.state, a);
    else
      replay_decode(cfg, budget, w, plan, *d.state, a);
    return {};
  }
  if (std::any_of(plan.heads.begin(), plan.heads.end(), [](const HeadPlan& hp) { return needs_codec(hp); })) {
    if (per_query_head)
      throw Error("policy " + cfg.policy + ": plans with encoded tokens must have one entry per KV head");
    a.entries = Hkv;
    return {std::nullopt, account_codec(index, cfg, plan, w, a)};
  }
  a.entries = static_cast<std::int64_t>(plan.heads.size());
  OneShot shot;
  shot.config = index;
  for (const HeadPlan& hp : plan.heads) {
    kvcache::KeepBits kb = kvcache::keep_bits(hp, c);
    std::vector<std::uint64_t>& bits = kb.words;
    const std::int64_t kept = kb.kept;
    for (std::int64_t j = 0; j < c; ++j)
      a.mix(bits[static_cast<std::size_t>(j / 64)] >> (j % 64) & 1 ? 0x9dull : 0x3bull);
    // Memory: every entry holds its own K/V (a per-query-head plan stores G copies per group).
    a.kept += kept;
    for (std::int64_t i = 0; i < w.T - c; ++i)
      a.kept_after_step[static_cast<std::size_t>(i)] += static_cast<double>(kept + i + 1);
    for (int r = 0; r < (per_query_head ? 1 : G); ++r) {
      shot.bits.push_back(bits);
      shot.count.push_back(kept);
    }
  }
  return {std::move(shot), std::nullopt};
}

static std::int64_t symmetric_difference(const std::vector<std::uint64_t>& x, const std::vector<std::uint64_t>& y) {
  std::int64_t n = 0;
  for (std::size_t k = 0; k < x.size(); ++k) n += std::popcount(x[k] ^ y[k]);
  return n;
}

// Order in which to build the shots' partial outputs for one KV head: a minimum spanning tree
// over the keep-sets, rooted at the empty set (partial output 0) and the full set (known from
// the shared pass), with edge cost |symmetric difference|. Each shot is then its parent plus
// the tokens it adds minus those it removes: similar policies and neighbouring budgets of one
// policy cost only their difference. parent: -1 empty, -2 full, else a shot index.
BuildOrder spanning_tree(const std::vector<OneShot>& shots, int q_head, std::int64_t c) {
  const auto kv = static_cast<std::size_t>(q_head);  // (indexes the per-query-head sets)
  const std::size_t n = shots.size();
  BuildOrder b;
  b.parent.assign(n, -1);
  std::vector<std::int64_t> dist(n);
  std::vector<char> done(n, 0);
  for (std::size_t p = 0; p < n; ++p) {
    const std::int64_t kept = shots[p].count[kv];
    dist[p] = std::min(kept, c - kept);
    b.parent[p] = kept <= c - kept ? -1 : -2;
  }
  for (std::size_t step = 0; step < n; ++step) {
    std::size_t best = n;
    for (std::size_t p = 0; p < n; ++p)
      if (!done[p] && (best == n || dist[p] < dist[best])) best = p;
    done[best] = 1;
    b.order.push_back(best);
    for (std::size_t p = 0; p < n; ++p) {
      if (done[p]) continue;
      const std::int64_t dd = symmetric_difference(shots[p].bits[kv], shots[best].bits[kv]);
      if (dd < dist[p]) {
        dist[p] = dd;
        b.parent[p] = static_cast<std::int64_t>(best);
      }
    }
  }
  return b;
}

// Phase B for one query head: every shot's partial output P = sum over kept tokens before c of
// a_ij [v_j, 1] (the last column is the kept attention mass), built along the spanning tree,
// then the per-row recall and output error.
void score_shots(const LayerWork& w, const std::vector<OneShot>& shots, const BuildOrder& tree, int q_head,
                 std::vector<std::vector<double>>& recall_out, std::vector<std::vector<double>>& err_out) {
  const int kv = q_head / w.g.group(), d = w.g.head_dim;
  const std::int64_t c = w.c, E = w.E;
  const Mat& A = w.attn[static_cast<std::size_t>(q_head)];
  const Mat& V = w.full_v[static_cast<std::size_t>(kv)];
  Mat full(E, d + 1);  // the full set's partial output, from the shared pass
  full.leftCols(d) = w.out[static_cast<std::size_t>(q_head)] - w.out_tail[static_cast<std::size_t>(q_head)];
  full.col(d) = (1.0f - w.tail_mass[static_cast<std::size_t>(q_head)].array()).matrix();
  std::vector<Mat> partial(shots.size());
  thread_local FloatBuffer wbuf, vbuf;
  std::vector<std::int32_t> add, rem;
  for (const std::size_t p : tree.order) {
    const std::int64_t parent = tree.parent[p];
    const auto& bits = shots[p].bits[static_cast<std::size_t>(q_head)];
    add.clear();
    rem.clear();
    for (std::size_t k = 0; k < bits.size(); ++k) {
      const std::uint64_t base =
          parent == -1   ? 0
          : parent == -2 ? ~std::uint64_t{0}
                         : shots[static_cast<std::size_t>(parent)].bits[static_cast<std::size_t>(q_head)][k];
      for (std::uint64_t x = bits[k] & ~base; x; x &= x - 1)
        add.push_back(static_cast<std::int32_t>(k * 64 + static_cast<std::size_t>(std::countr_zero(x))));
      for (std::uint64_t x = base & ~bits[k]; x; x &= x - 1) {
        const auto j = static_cast<std::int64_t>(k * 64 + static_cast<std::size_t>(std::countr_zero(x)));
        if (j < c) rem.push_back(static_cast<std::int32_t>(j));
      }
    }
    Mat& P = partial[p];
    P = parent == -1 ? Mat::Zero(E, d + 1) : parent == -2 ? full : partial[static_cast<std::size_t>(parent)];
    const auto nd = static_cast<Eigen::Index>(add.size() + rem.size());
    if (nd > 0) {
      wbuf.resize(static_cast<std::size_t>(E * nd));
      vbuf.resize(static_cast<std::size_t>(nd * (d + 1)));
      Eigen::Map<Mat> Wd(wbuf.data(), E, nd), Vd(vbuf.data(), nd, d + 1);
      for (Eigen::Index k = 0; k < nd; ++k) {
        const bool adding = k < static_cast<Eigen::Index>(add.size());
        const std::int32_t j =
            adding ? add[static_cast<std::size_t>(k)] : rem[static_cast<std::size_t>(k) - add.size()];
        const float sign = adding ? 1.0f : -1.0f;
        Vd.row(k).head(d) = sign * V.row(j);
        Vd(k, d) = sign;
      }
      for (Eigen::Index i = 0; i < E; ++i) {
        const float* src = A.row(i).data();
        float* dst = Wd.row(i).data();
        for (std::size_t k = 0; k < add.size(); ++k) dst[k] = src[add[k]];
        for (std::size_t k = 0; k < rem.size(); ++k) dst[add.size() + k] = src[rem[k]];
      }
      P.noalias() += Wd * Vd;
    }
    auto& rec = recall_out[p];
    auto& er = err_out[p];
    rec.resize(static_cast<std::size_t>(E));
    er.resize(static_cast<std::size_t>(E));
    for (Eigen::Index i = 0; i < E; ++i) {
      const double m =
          std::clamp(static_cast<double>(P(i, d)) + w.tail_mass[static_cast<std::size_t>(q_head)](i), 1e-30, 1.0);
      const auto o = w.out[static_cast<std::size_t>(q_head)].row(i);
      const auto tail = w.out_tail[static_cast<std::size_t>(q_head)].row(i);
      double diff2 = 0, norm2 = 0;
      for (int x = 0; x < d; ++x) {
        const double approx = (static_cast<double>(P(i, x)) + tail(x)) / m;
        diff2 += (o(x) - approx) * (o(x) - approx);
        norm2 += static_cast<double>(o(x)) * o(x);
      }
      rec[static_cast<std::size_t>(i)] = m;
      er[static_cast<std::size_t>(i)] = norm2 > 0 ? std::sqrt(diff2 / norm2) : 0.0;
    }
  }
}

// Errors raised while a policy runs name the policy (unless they already do).
Planned plan_config(std::size_t index, const ReplayConfig& cfg, const ConfigBudget& budget, const LayerWork& w,
                    Accumulator& a) {
  try {
    return plan_config_unchecked(index, cfg, budget, w, a);
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (msg.rfind("policy ", 0) == 0) throw;
    throw Error("policy " + cfg.label() + ": " + msg);
  }
}

}  // namespace kvsim::replay_detail
