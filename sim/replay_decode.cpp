#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/event_queue.h"
#include "sim/replay_internal.h"

namespace kvsim::replay_detail {

namespace {

// What phase 1 leaves for phase 2: evicted[i][kv], the tokens dropped after step i; recall[qh][i],
// the attention mass row i keeps.
struct DecodeWalk {
  std::vector<std::vector<std::vector<std::int32_t>>> evicted;
  std::vector<std::vector<double>> recall;
};

// Phase 1: the policy's walk from the cache `walk` holds at the compression point.
DecodeWalk policy_walk(const ReplayConfig& cfg, const ConfigBudget& b, const LayerWork& w, DecodeState& state,
                       kvcache::LayerIndex& walk, Accumulator& a) {
  const int Hkv = w.g.n_kv_heads, Hq = w.g.n_q_heads;
  const std::int64_t E = w.E, budget_tokens = b.tokens;
  DecodeWalk out;
  out.evicted.resize(static_cast<std::size_t>(E));
  out.recall.assign(static_cast<std::size_t>(Hq), std::vector<double>(static_cast<std::size_t>(E)));
  auto& evicted = out.evicted;
  auto& recall = out.recall;
  // On the token-step clock: at each decode step the token joins and its query attends over
  // the cache (priority 0), then the policy evicts (priority 1).
  enum Priority { kAttend = 0, kEvict = 1 };
  EventQueue<std::int64_t> clock;
  std::vector<std::vector<float>> weights(static_cast<std::size_t>(Hq));
  auto attend = [&](std::int64_t i) {
    kvcache::append_token(walk, static_cast<std::int32_t>(w.eval_tokens[static_cast<std::size_t>(i)]));
    const std::vector<double> mass = cache_weights(w, i, walk.tokens, weights, state.needs_attention());
    for (int qh = 0; qh < Hq; ++qh)
      recall[static_cast<std::size_t>(qh)][static_cast<std::size_t>(i)] = mass[static_cast<std::size_t>(qh)];
  };
  auto evict = [&](std::int64_t i) {
    const auto t = static_cast<std::int32_t>(w.eval_tokens[static_cast<std::size_t>(i)]);
    auto& ev = evicted[static_cast<std::size_t>(i)];
    ev.assign(static_cast<std::size_t>(Hkv), {});
    const std::function<std::shared_ptr<const LayerSignals>()> signals = [&] {
      return signals_over(w, walk.tokens, t + 1);
    };
    DecodeStep step{t, walk.tokens, weights, budget_tokens, segment_of(w, t)};
    step.signals = &signals;
    state.step(step, ev);
    kvcache::apply_evictions(cfg.policy, ev, t, b.rows_after_step(), walk, nullptr);
    for (const auto& evicted_kv : ev)
      for (const auto j : evicted_kv) a.mix(static_cast<std::uint64_t>(j) + 1);
    const std::int64_t size = walk.rows();
    a.kept_after_step[static_cast<std::size_t>(i)] += static_cast<double>(size);
  };
  for (std::int64_t i = 0; i < E; ++i) {
    const std::int64_t t = w.eval_tokens[static_cast<std::size_t>(i)];
    clock.schedule(t, kAttend, [&, i] { attend(i); });
    clock.schedule(t, kEvict, [&, i] { evict(i); });
  }
  clock.run();
  return out;
}

// Phase 2: each row's relative output error, block by block, from the walk's evictions.
std::vector<std::vector<double>> block_errors(const LayerWork& w, const std::vector<std::vector<std::int32_t>>& initial,
                                              const DecodeWalk& dw) {
  const int Hkv = w.g.n_kv_heads, Hq = w.g.n_q_heads, G = w.g.group(), d = w.g.head_dim;
  const std::int64_t c = w.c, E = w.E;
  const auto& evicted = dw.evicted;
  const auto& recall = dw.recall;
  constexpr std::int64_t kBlock = 16;
  thread_local FloatBuffer wbuf, vbuf, rbuf;
  std::vector<std::vector<double>> err(static_cast<std::size_t>(Hq), std::vector<double>(static_cast<std::size_t>(E)));
  for (int kv = 0; kv < Hkv; ++kv) {
    std::vector<std::int32_t> cache = initial[static_cast<std::size_t>(kv)], dropped;
    {
      std::size_t k = 0;
      for (std::int32_t j = 0; j < static_cast<std::int32_t>(c); ++j) {
        if (k < cache.size() && cache[k] == j)
          ++k;
        else
          dropped.push_back(j);
      }
    }
    const Mat& V = w.full_v[static_cast<std::size_t>(kv)];
    for (std::int64_t b0 = 0; b0 < E; b0 += kBlock) {
      const std::int64_t nb = std::min(kBlock, E - b0);
      std::vector<std::int32_t> kept_side = cache;
      for (std::int64_t i = b0; i < b0 + nb; ++i)
        kept_side.push_back(static_cast<std::int32_t>(w.eval_tokens[static_cast<std::size_t>(i)]));
      const bool use_dropped = dropped.size() < kept_side.size();
      const auto& side = use_dropped ? dropped : kept_side;
      const auto ns = static_cast<Eigen::Index>(side.size());
      wbuf.resize(static_cast<std::size_t>(G * nb * ns));
      vbuf.resize(static_cast<std::size_t>(ns * d));
      rbuf.resize(static_cast<std::size_t>(G * nb * d));
      Eigen::Map<Mat> W(wbuf.data(), G * nb, ns), VS(vbuf.data(), ns, d), R(rbuf.data(), G * nb, d);
      for (Eigen::Index k = 0; k < ns; ++k) VS.row(k) = V.row(side[static_cast<std::size_t>(k)]);
      for (int r = 0; r < G; ++r) {
        const Mat& A = w.attn[static_cast<std::size_t>(kv * G + r)];
        for (std::int64_t i = 0; i < nb; ++i) {
          const float* src = A.row(b0 + i).data();
          float* dst = W.row(r * nb + i).data();
          for (Eigen::Index k = 0; k < ns; ++k) dst[k] = src[side[static_cast<std::size_t>(k)]];
        }
      }
      R.noalias() = W * VS;
      // Rows after an in-block eviction: that token left the kept side (or joined the dropped one).
      for (std::int64_t i = b0; i < b0 + nb; ++i) {
        for (std::int64_t e = b0; e < i; ++e) {
          for (auto j : evicted[static_cast<std::size_t>(e)][static_cast<std::size_t>(kv)]) {
            for (int r = 0; r < G; ++r) {
              const float coef = w.attn[static_cast<std::size_t>(kv * G + r)](i, j);
              R.row(r * nb + (i - b0)) += (use_dropped ? coef : -coef) * V.row(j);
            }
          }
        }
        for (int r = 0; r < G; ++r) {
          const auto qh = static_cast<std::size_t>(kv * G + r);
          const double m = recall[qh][static_cast<std::size_t>(i)];
          const auto o = w.out[qh].row(i);
          double diff2 = 0, norm2 = 0;
          for (int x = 0; x < d; ++x) {
            const double sum = R(r * nb + (i - b0), x);
            const double approx = (use_dropped ? o(x) - sum : sum) / m;
            diff2 += (o(x) - approx) * (o(x) - approx);
            norm2 += static_cast<double>(o(x)) * o(x);
          }
          err[qh][static_cast<std::size_t>(i)] = norm2 > 0 ? std::sqrt(diff2 / norm2) : 0.0;
        }
      }
      // Advance the sets past this block.
      for (std::int64_t i = b0; i < b0 + nb; ++i) {
        cache.push_back(static_cast<std::int32_t>(w.eval_tokens[static_cast<std::size_t>(i)]));
        for (auto j : evicted[static_cast<std::size_t>(i)][static_cast<std::size_t>(kv)]) {
          cache.erase(std::lower_bound(cache.begin(), cache.end(), j));
          dropped.insert(std::lower_bound(dropped.begin(), dropped.end(), j), j);
        }
      }
    }
  }
  return err;
}

}  // namespace

void require_decode_queries(const ReplayConfig& cfg, const LayerWork& w, const std::string& why) {
  if (w.E != w.T - w.c)
    throw Error("policy " + cfg.policy + " " + why +
                " and needs the query of every token after the compression point (" + std::to_string(w.T - w.c) +
                "), but the trace recorded " + std::to_string(w.E) + "; capture with all decode-step queries");
}

// Decode-time policies: the cache changes every step, so each evaluation row is scored against
// its own kept set. Softmax restricted to the cache is the full softmax renormalised over it,
// so the shared full attention still serves. Two phases: (1) walk the steps, gathering the
// weights the policy reads and logging its evictions; (2) compute the outputs in blocks of
// steps with one GEMM per block over the set at the block's start (on the smaller side), then
// correct each row for the few tokens evicted earlier in the same block. Tokens that join
// later in the block need no correction: causality already gives them zero weight.
void replay_decode(const ReplayConfig& cfg, const ConfigBudget& b, const LayerWork& w, const LayerPlan& plan,
                   DecodeState& state, Accumulator& a) {
  const int Hkv = w.g.n_kv_heads, Hq = w.g.n_q_heads;
  const std::int64_t c = w.c, E = w.E;
  require_decode_queries(cfg, w, "evicts at every decode step");
  kvcache::LayerIndex walk = kvcache::LayerIndex::prefix(Hkv, c);
  kvcache::apply_plan(cfg, plan, w.g, walk, nullptr);
  const std::vector<std::vector<std::int32_t>> initial = walk.tokens;
  for (const auto& t : initial) {
    a.kept += static_cast<std::int64_t>(t.size());
    a.mix(t.size());
  }

  const DecodeWalk dw = policy_walk(cfg, b, w, state, walk, a);
  const std::vector<std::vector<double>> err = block_errors(w, initial, dw);
  const auto& recall = dw.recall;
  for (std::int64_t i = 0; i < E; ++i)
    for (int qh = 0; qh < Hq; ++qh)
      a.add_row(w.layer, qh, i, recall[static_cast<std::size_t>(qh)][static_cast<std::size_t>(i)],
                err[static_cast<std::size_t>(qh)][static_cast<std::size_t>(i)],
                w.out[static_cast<std::size_t>(qh)].row(i).squaredNorm());
}

}  // namespace kvsim::replay_detail
