#include "sim/replay.h"

#include <Eigen/Dense>
#include <algorithm>
#include <bit>
#include <chrono>
#include <optional>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>

#include "core/error.h"
#include "policies/codec.h"

namespace kvsim {

const char* mode_name(ReplayMode m) { return m == ReplayMode::QueryAware ? "query-aware" : "query-agnostic"; }

ReplayMode parse_mode(const std::string& s) {
  if (s == "query-aware") return ReplayMode::QueryAware;
  if (s == "query-agnostic") return ReplayMode::QueryAgnostic;
  throw Error("--mode is '" + s + "', expected query-aware or query-agnostic");
}

namespace {

using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using StridedMap = Eigen::Map<const Mat, 0, Eigen::OuterStride<>>;
// Layer buffers aligned like Eigen's own storage, so vectorised kernels take the same path
// whatever address the allocator returns (bit-reproducible runs).
using FloatBuffer = std::vector<float, Eigen::aligned_allocator<float>>;

// Row-wise causal softmax in place: row i may see keys [0, limit[i]]; the rest become 0.
void causal_softmax(Mat& s, const std::vector<std::int64_t>& limit) {
  for (Eigen::Index i = 0; i < s.rows(); ++i) {
    const Eigen::Index last = std::min<Eigen::Index>(limit[static_cast<std::size_t>(i)], s.cols() - 1);
    auto row = s.row(i);
    const float m = row.head(last + 1).maxCoeff();
    row.head(last + 1) = (row.head(last + 1).array() - m).exp();
    row.head(last + 1) /= row.head(last + 1).sum();
    if (last + 1 < s.cols()) row.tail(s.cols() - last - 1).setZero();
  }
}

// One layer of one request, as policies see it at the compression point c.
class ReplaySignals final : public LayerSignals {
 public:
  ReplaySignals(const KvGeometry& g, int layer, std::int64_t c, const RequestHeader& h, const FloatBuffer& q,
                const std::vector<Mat>& keys, const std::vector<Mat>& values, const std::vector<Mat>& future)
      : g_(g), layer_(layer), c_(c), h_(h), q_(q), keys_(keys), values_(values), future_(future) {
    for (std::size_t r = 0; r < h.q_index.size() && h.q_index[r] < c; ++r) observed_.push_back(h.q_index[r]);
  }
  const KvGeometry& geometry() const override { return g_; }
  int layer() const override { return layer_; }
  std::int64_t n_tokens() const override { return c_; }
  std::span<const std::int32_t> positions() const override {
    return {h_.positions.data(), static_cast<std::size_t>(c_)};
  }
  std::span<const std::int8_t> segments() const override { return {h_.segments.data(), static_cast<std::size_t>(c_)}; }
  MatrixView keys(int kv_head) const override { return view(keys_[static_cast<std::size_t>(kv_head)]); }
  MatrixView values(int kv_head) const override { return view(values_[static_cast<std::size_t>(kv_head)]); }

  MatrixView window_attention(int q_head, int window) const override {
    if (window > c_) window = static_cast<int>(c_);
    // The window's queries are the last `window` observed rows, which must be exactly the last
    // `window` tokens before the compression point.
    const auto m = static_cast<std::int64_t>(observed_.size());
    if (m < window || observed_[static_cast<std::size_t>(m - window)] != c_ - window)
      throw Error("request '" + h_.id + "': the policy needs the queries of the last " + std::to_string(window) +
                  " tokens before the compression point (token " + std::to_string(c_) +
                  "), but the trace did not record them all; capture with more queries (e.g. kvsim trace synth "
                  "--queries all, or a larger --query-window)");
    return attention(q_head, m - window, window, 1000 + window);
  }
  OwnedMatrix observed_attention(int q_head) const override {
    if (observed_.empty())
      throw Error("request '" + h_.id + "': the policy needs prompt queries before the compression point (token " +
                  std::to_string(c_) + "), but the trace recorded none there");
    const Mat s = compute_attention(q_head, 0, static_cast<std::int64_t>(observed_.size()));
    return OwnedMatrix{std::vector<float>(s.data(), s.data() + s.size()), s.rows(), s.cols()};
  }
  std::span<const std::int32_t> observed_rows() const override { return observed_; }
  MatrixView observed_queries(int q_head) const override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find({q_head, -1});
    if (it == cache_.end()) {
      const int Hq = g_.n_q_heads, d = g_.head_dim;
      const auto m = static_cast<Eigen::Index>(observed_.size());
      it = cache_.emplace(std::make_pair(q_head, -1), Mat(StridedMap(q_.data() + q_head * d, m, d, Eigen::OuterStride<>(Hq * d)))).first;
    }
    return view(it->second);
  }
  MatrixView future_attention(int q_head) const override { return view(future_[static_cast<std::size_t>(q_head)]); }
  std::shared_ptr<const void> memo(const void* owner,
                                   const std::function<std::shared_ptr<const void>()>& make) const override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      const auto it = memo_.find(owner);
      if (it != memo_.end()) return it->second;
    }
    // Computed outside the lock (it may need the signals); a racing duplicate is discarded.
    auto value = make();
    std::lock_guard<std::mutex> lock(mu_);
    return memo_.emplace(owner, std::move(value)).first->second;
  }

 private:
  static MatrixView view(const Mat& m) { return {m.data(), m.rows(), m.cols()}; }

  // Causal attention of observed rows [first, first + count) over the c cached keys.
  Mat compute_attention(int q_head, std::int64_t first, std::int64_t count) const {
    const int Hq = g_.n_q_heads, d = g_.head_dim;
    const StridedMap q(q_.data() + (first * Hq + q_head) * d, count, d, Eigen::OuterStride<>(Hq * d));
    Mat s = (q * keys_[static_cast<std::size_t>(q_head / g_.group())].transpose()) / std::sqrt(static_cast<float>(d));
    std::vector<std::int64_t> limit(static_cast<std::size_t>(count));
    for (std::int64_t i = 0; i < count; ++i) limit[static_cast<std::size_t>(i)] = observed_[static_cast<std::size_t>(first + i)];
    causal_softmax(s, limit);
    return s;
  }
  // The same, kept for the layer (small: observation windows). Computed outside the lock so
  // threads do not queue behind one GEMM; a racing duplicate is discarded.
  MatrixView attention(int q_head, std::int64_t first, std::int64_t count, int tag) const {
    const auto key = std::make_pair(q_head, tag);
    {
      std::lock_guard<std::mutex> lock(mu_);
      const auto it = cache_.find(key);
      if (it != cache_.end()) return view(it->second);
    }
    Mat s = compute_attention(q_head, first, count);
    std::lock_guard<std::mutex> lock(mu_);
    return view(cache_.emplace(key, std::move(s)).first->second);
  }

  const KvGeometry& g_;
  int layer_;
  std::int64_t c_;
  const RequestHeader& h_;
  const FloatBuffer& q_;
  const std::vector<Mat>& keys_;
  const std::vector<Mat>& values_;
  const std::vector<Mat>& future_;
  std::vector<std::int32_t> observed_;
  mutable std::mutex mu_;
  mutable std::map<std::pair<int, int>, Mat> cache_;
  mutable std::map<const void*, std::shared_ptr<const void>> memo_;
};

// Accumulates one config's per-row metrics over the layers of a request.
struct Accumulator {
  std::vector<std::vector<float>> kl, err;  // [layer][row]
  std::vector<double> layer_recall, layer_kl, layer_err;
  std::vector<std::int64_t> layer_rows;
  std::int64_t kept = 0;                    // right after compression, over layers and heads
  std::int64_t entries = 0;                 // plan entries of one layer (KV or query heads)
  std::vector<double> kept_after_step;      // [T - c] cache size after each later step
  std::uint64_t hash = 1469598103934665603ull;

  void mix(std::uint64_t x) { hash = (hash ^ x) * 1099511628211ull; }  // FNV-1a
  void add_row(int layer, double recall, double row_err) {
    recall = std::clamp(recall, 1e-30, 1.0);
    const double kl_row = -std::log(recall);
    kl[static_cast<std::size_t>(layer)].push_back(static_cast<float>(kl_row));
    err[static_cast<std::size_t>(layer)].push_back(static_cast<float>(row_err));
    layer_recall[static_cast<std::size_t>(layer)] += recall;
    layer_kl[static_cast<std::size_t>(layer)] += kl_row;
    layer_err[static_cast<std::size_t>(layer)] += row_err;
    ++layer_rows[static_cast<std::size_t>(layer)];
  }
};

// Everything one layer shares across configs.
struct LayerWork {
  const KvGeometry& g;
  int layer;
  std::int64_t c, E, T;
  const std::vector<std::int64_t>& eval_tokens;  // [E] token index of each evaluation row
  const ReplaySignals& signals;
  const std::vector<Mat>& attn;       // [Hq] full attention of the evaluation rows, E x T
  const std::vector<Mat>& out;        // [Hq] full attention outputs, E x d
  const std::vector<Mat>& out_tail;   // [Hq] part of out from tokens >= c (never compressed here)
  const std::vector<Eigen::VectorXf>& tail_mass;
  const std::vector<Mat>& full_v;     // [Hkv] T x d
};

// Decode-time policies: the cache changes every step, so each evaluation row is scored against
// its own kept set. Softmax restricted to the cache is the full softmax renormalised over it,
// so the shared full attention still serves. Two phases: (1) walk the steps, gathering the
// weights the policy reads and logging its evictions; (2) compute the outputs in blocks of
// steps with one GEMM per block over the set at the block's start (on the smaller side), then
// correct each row for the few tokens evicted earlier in the same block. Tokens that join
// later in the block need no correction: causality already gives them zero weight.
void replay_decode(const ReplayConfig& cfg, std::int64_t budget_tokens, const LayerWork& w, const LayerPlan& plan,
                   DecodeState& state, Accumulator& a) {
  const int Hkv = w.g.n_kv_heads, Hq = w.g.n_q_heads, G = w.g.group(), d = w.g.head_dim;
  const std::int64_t c = w.c, E = w.E;
  if (E != w.T - c)
    throw Error("policy " + cfg.policy + " evicts at every decode step and needs the query of every token after the "
                "compression point (" + std::to_string(w.T - c) + "), but the trace recorded " + std::to_string(E) +
                "; capture with all decode-step queries");
  std::vector<std::vector<std::int32_t>> initial(static_cast<std::size_t>(Hkv));
  for (int kv = 0; kv < Hkv; ++kv) {
    const HeadPlan& hp = plan.heads[static_cast<std::size_t>(kv)];
    for (std::int64_t j = 0; j < c; ++j)
      if (hp.codec[static_cast<std::size_t>(j)] != TokenCodec::Drop) initial[static_cast<std::size_t>(kv)].push_back(static_cast<std::int32_t>(j));
    a.kept += static_cast<std::int64_t>(initial[static_cast<std::size_t>(kv)].size());
    a.mix(initial[static_cast<std::size_t>(kv)].size());
  }

  // Phase 1: the policy's walk. evicted[i][kv]: tokens dropped after step i.
  std::vector<std::vector<std::vector<std::int32_t>>> evicted(static_cast<std::size_t>(E));
  std::vector<std::vector<double>> recall(static_cast<std::size_t>(Hq), std::vector<double>(static_cast<std::size_t>(E)));
  {
    std::vector<std::vector<std::int32_t>> cache = initial;
    std::vector<std::vector<float>> weights(static_cast<std::size_t>(Hq));
    for (std::int64_t i = 0; i < E; ++i) {
      const auto t = static_cast<std::int32_t>(w.eval_tokens[static_cast<std::size_t>(i)]);
      for (auto& ch : cache) ch.push_back(t);
      for (int qh = 0; qh < Hq; ++qh) {
        const auto& ch = cache[static_cast<std::size_t>(qh / G)];
        const Mat& A = w.attn[static_cast<std::size_t>(qh)];
        auto& wt = weights[static_cast<std::size_t>(qh)];
        wt.resize(ch.size());
        double m = 0;
        for (std::size_t k = 0; k < ch.size(); ++k) m += (wt[k] = A(i, ch[k]));
        recall[static_cast<std::size_t>(qh)][static_cast<std::size_t>(i)] = m;
        if (state.needs_attention())
          for (auto& x : wt) x = static_cast<float>(x / m);
      }
      auto& ev = evicted[static_cast<std::size_t>(i)];
      ev.assign(static_cast<std::size_t>(Hkv), {});
      state.step(DecodeStep{t, cache, weights, budget_tokens}, ev);
      std::int64_t size = 0;
      for (int kv = 0; kv < Hkv; ++kv) {
        auto& ch = cache[static_cast<std::size_t>(kv)];
        for (auto j : ev[static_cast<std::size_t>(kv)]) {
          const auto it = std::lower_bound(ch.begin(), ch.end(), j);
          if (it == ch.end() || *it != j)
            throw Error("policy " + cfg.policy + ": evicted token " + std::to_string(j) + " that is not in the cache");
          ch.erase(it);
          a.mix(static_cast<std::uint64_t>(j) + 1);
        }
        if (static_cast<std::int64_t>(ch.size()) > std::max<std::int64_t>(budget_tokens, 0))
          throw Error("policy " + cfg.policy + ": cache holds " + std::to_string(ch.size()) + " tokens after step " +
                      std::to_string(t) + ", over its budget of " + std::to_string(budget_tokens));
        size += static_cast<std::int64_t>(ch.size());
      }
      a.kept_after_step[static_cast<std::size_t>(i)] += static_cast<double>(size);
    }
  }

  // Phase 2: outputs, block by block.
  constexpr std::int64_t kBlock = 16;
  thread_local FloatBuffer wbuf, vbuf, rbuf;
  std::vector<std::vector<double>> err(static_cast<std::size_t>(Hq), std::vector<double>(static_cast<std::size_t>(E)));
  for (int kv = 0; kv < Hkv; ++kv) {
    std::vector<std::int32_t> cache = initial[static_cast<std::size_t>(kv)], dropped;
    {
      std::size_t k = 0;
      for (std::int32_t j = 0; j < static_cast<std::int32_t>(c); ++j) {
        if (k < cache.size() && cache[k] == j) ++k;
        else dropped.push_back(j);
      }
    }
    const Mat& V = w.full_v[static_cast<std::size_t>(kv)];
    for (std::int64_t b0 = 0; b0 < E; b0 += kBlock) {
      const std::int64_t nb = std::min(kBlock, E - b0);
      std::vector<std::int32_t> kept_side = cache;
      for (std::int64_t i = b0; i < b0 + nb; ++i) kept_side.push_back(static_cast<std::int32_t>(w.eval_tokens[static_cast<std::size_t>(i)]));
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
  for (std::int64_t i = 0; i < E; ++i)
    for (int qh = 0; qh < Hq; ++qh)
      a.add_row(w.layer, recall[static_cast<std::size_t>(qh)][static_cast<std::size_t>(i)],
                err[static_cast<std::size_t>(qh)][static_cast<std::size_t>(i)]);
}

// A one-shot config's keep-sets in one layer: a bitset over the c cached tokens per query head
// (query heads of a group share their KV head's set unless the plan has one per query head).
struct OneShot {
  std::size_t config = 0;
  std::vector<std::vector<std::uint64_t>> bits;  // [Hq][ceil(c / 64)]
  std::vector<std::int64_t> count;               // kept tokens per query head
};

// Phase A of a layer, for one config: asks the policy for its plan. Decode-time configs are
// replayed entirely here; uncompressed ones record exact rows; one-shot ones return their
// keep-sets for the shared phase B.
std::optional<OneShot> plan_config(std::size_t index, const ReplayConfig& cfg, std::int64_t budget_tokens,
                                   const LayerWork& w, Accumulator& a) {
  const int Hkv = w.g.n_kv_heads;
  const std::int64_t c = w.c;
  bool compress = cfg.impl->respects_budget() && cfg.budget < 1.0;
  if (!compress && cfg.impl->respects_budget()) {
    // Budget 1.0 fits the whole cache: nothing may be dropped (and no decode-time eviction
    // starts: the cache never exceeds its budget). Ask the policy anyway, so that a policy
    // that drops tokens it has room for is caught. Per-query-head plans are the exception:
    // G copies of the cache do not fit the bytes of one, so they compress as usual.
    const LayerPlan plan = cfg.impl->compress(w.signals, Budget{c, cfg.budget});
    if (static_cast<int>(plan.heads.size()) != Hkv) {
      compress = true;
    } else {
      for (const HeadPlan& hp : plan.heads)
        if (hp.kept() != c)
          throw Error("policy " + cfg.policy + ": dropped " + std::to_string(c - hp.kept()) +
                      " tokens with a budget that fits the whole cache (" + std::to_string(c) + " tokens)");
    }
  }
  if (!compress) {  // the full cache: exact by definition
    for (int kv = 0; kv < Hkv; ++kv) a.mix(static_cast<std::uint64_t>(c));
    a.kept += c * Hkv;
    for (std::int64_t i = 0; i < w.T - c; ++i)
      a.kept_after_step[static_cast<std::size_t>(i)] += static_cast<double>((c + i + 1) * Hkv);
    for (std::int64_t row = 0; row < w.E * w.g.n_q_heads; ++row) a.add_row(w.layer, 1.0, 0.0);
    return std::nullopt;
  }
  const int Hq = w.g.n_q_heads, G = w.g.group();
  LayerPlan plan = cfg.impl->compress(w.signals, Budget{budget_tokens, cfg.budget});
  const bool per_query_head = static_cast<int>(plan.heads.size()) == Hq && Hq != Hkv;
  if (static_cast<int>(plan.heads.size()) != Hkv && !per_query_head)
    throw Error("policy " + cfg.policy + ": plan has " + std::to_string(plan.heads.size()) + " heads, expected " +
                std::to_string(Hkv) + " (one per KV head) or " + std::to_string(Hq) + " (one per query head)");
  for (const HeadPlan& hp : plan.heads) {
    if (static_cast<std::int64_t>(hp.codec.size()) != c)
      throw Error("policy " + cfg.policy + ": plan covers " + std::to_string(hp.codec.size()) + " tokens, expected " +
                  std::to_string(c));
    for (TokenCodec codec : hp.codec)
      if (!codec_supported(codec))
        throw Error("policy " + cfg.policy + ": plan encodes tokens as " + codec_name(codec) +
                    ", which this replay does not reconstruct yet (drop and fp16 only)");
  }
  if (auto state = cfg.impl->start_decode(w.signals, plan, Budget{budget_tokens, cfg.budget})) {
    if (per_query_head) throw Error("policy " + cfg.policy + ": decode-time plans must have one entry per KV head");
    a.entries = Hkv;
    replay_decode(cfg, budget_tokens, w, plan, *state, a);
    return std::nullopt;
  }
  a.entries = static_cast<std::int64_t>(plan.heads.size());
  OneShot shot;
  shot.config = index;
  const auto words = static_cast<std::size_t>((c + 63) / 64);
  for (const HeadPlan& hp : plan.heads) {
    std::vector<std::uint64_t> bits(words, 0);
    std::int64_t kept = 0;
    for (std::int64_t j = 0; j < c; ++j) {
      const bool keep = hp.codec[static_cast<std::size_t>(j)] != TokenCodec::Drop;
      if (keep) bits[static_cast<std::size_t>(j / 64)] |= std::uint64_t{1} << (j % 64);
      kept += keep;
      a.mix(keep ? 0x9dull : 0x3bull);
    }
    // Memory: every entry holds its own K/V (a per-query-head plan stores G copies per group).
    a.kept += kept;
    for (std::int64_t i = 0; i < w.T - c; ++i) a.kept_after_step[static_cast<std::size_t>(i)] += static_cast<double>(kept + i + 1);
    for (int r = 0; r < (per_query_head ? 1 : G); ++r) {
      shot.bits.push_back(bits);
      shot.count.push_back(kept);
    }
  }
  return shot;
}

std::int64_t symmetric_difference(const std::vector<std::uint64_t>& x, const std::vector<std::uint64_t>& y) {
  std::int64_t n = 0;
  for (std::size_t k = 0; k < x.size(); ++k) n += std::popcount(x[k] ^ y[k]);
  return n;
}

// Order in which to build the shots' partial outputs for one KV head: a minimum spanning tree
// over the keep-sets, rooted at the empty set (partial output 0) and the full set (known from
// the shared pass), with edge cost |symmetric difference|. Each shot is then its parent plus
// the tokens it adds minus those it removes: similar policies and neighbouring budgets of one
// policy cost only their difference. parent: -1 empty, -2 full, else a shot index.
struct BuildOrder {
  std::vector<std::size_t> order;
  std::vector<std::int64_t> parent;
};

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
      const std::uint64_t base = parent == -1 ? 0 : parent == -2 ? ~std::uint64_t{0}
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
        const std::int32_t j = adding ? add[static_cast<std::size_t>(k)] : rem[static_cast<std::size_t>(k) - add.size()];
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
      const double m = std::clamp(static_cast<double>(P(i, d)) + w.tail_mass[static_cast<std::size_t>(q_head)](i), 1e-30, 1.0);
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

double percentile95(std::vector<float>& v) {
  if (v.empty()) return 0;
  const auto k = static_cast<std::size_t>(std::ceil(0.95 * static_cast<double>(v.size()))) - 1;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

}  // namespace

Replayer::Replayer(const TraceReader& reader, ReplayMode mode, std::vector<ReplayConfig> configs)
    : reader_(reader), mode_(mode), configs_(std::move(configs)) {}

RequestResult Replayer::replay(const std::string& request_id) const {
  const ModelGeometry& mg = reader_.geometry();
  const KvGeometry g{mg.n_layers, mg.n_q_heads, mg.n_kv_heads, mg.head_dim, mg.rope()};
  const RequestHeader h = reader_.header(request_id);
  const std::string ctx = reader_.path() + ": request '" + request_id + "'";
  const std::int64_t T = h.n_tokens();
  const std::int64_t c = mode_ == ReplayMode::QueryAware ? h.n_prompt : h.question_start;
  if (c < 1 || c >= T)
    throw Error(ctx + ": compression point " + std::to_string(c) + " (" + mode_name(mode_) +
                ") leaves no tokens to evaluate; expected 1 <= point < T = " + std::to_string(T) +
                (mode_ == ReplayMode::QueryAware ? " (the request needs generated tokens)" : " (the request needs a question)"));
  // Evaluation rows: the recorded queries at or after the compression point (a suffix of q_index).
  const auto first_eval = static_cast<std::int64_t>(
      std::lower_bound(h.q_index.begin(), h.q_index.end(), static_cast<std::int32_t>(c)) - h.q_index.begin());
  const std::int64_t E = h.n_queries() - first_eval;
  if (E == 0)
    throw Error(ctx + ": no recorded queries at or after the compression point " + std::to_string(c) +
                "; expected the question/answer queries in q_index");
  std::vector<std::int64_t> eval_limit(static_cast<std::size_t>(E));
  for (std::int64_t i = 0; i < E; ++i) eval_limit[static_cast<std::size_t>(i)] = h.q_index[static_cast<std::size_t>(first_eval + i)];

  const int L = g.n_layers, Hq = g.n_q_heads, Hkv = g.n_kv_heads, d = g.head_dim, G = g.group();
  const double kv_token_bytes = codec_token_bytes(TokenCodec::Fp16, d);  // per (layer, KV head, token)
  const std::size_t P = configs_.size();
  std::vector<std::int64_t> budget_tokens(P);
  std::vector<double> token_bytes(P), head_bytes(P);
  for (std::size_t p = 0; p < P; ++p) {
    const bool compress = configs_[p].impl->respects_budget() && configs_[p].budget < 1.0;
    token_bytes[p] = kv_token_bytes + (compress ? configs_[p].impl->state_bytes_per_token() : 0.0);
    head_bytes[p] = compress ? configs_[p].impl->state_bytes_per_head() : 0.0;
    // Tokens per (layer, KV head) that fit the byte budget after the policy's own state.
    budget_tokens[p] = compress ? std::max<std::int64_t>(
                                      0, static_cast<std::int64_t>(std::floor(
                                             (configs_[p].budget * static_cast<double>(c) * kv_token_bytes - head_bytes[p]) /
                                             token_bytes[p])))
                                : c;
  }
  std::vector<Accumulator> acc(P);
  for (auto& a : acc) {
    a.layer_recall.assign(static_cast<std::size_t>(L), 0);
    a.layer_kl.assign(static_cast<std::size_t>(L), 0);
    a.layer_err.assign(static_cast<std::size_t>(L), 0);
    a.layer_rows.assign(static_cast<std::size_t>(L), 0);
    a.kl.assign(static_cast<std::size_t>(L), {});
    a.err.assign(static_cast<std::size_t>(L), {});
    a.kept_after_step.assign(static_cast<std::size_t>(T - c), 0.0);
  }

  using Clock = std::chrono::steady_clock;
  auto since = [](Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  double read_s = 0, attention_s = 0, config_s = 0;
  FloatBuffer kbuf(reader_.layer_elements(request_id, Tensor::K)), vbuf(kbuf.size());
  FloatBuffer qbuf(reader_.layer_elements(request_id, Tensor::Q));
  // Per-layer buffers live across layers: same shapes every layer, so no reallocation (large
  // allocations churn mmap/munmap and TLB shootdowns otherwise).
  std::vector<Mat> keys(static_cast<std::size_t>(Hkv)), values(keys.size()), full_v(keys.size());
  std::vector<Mat> attn(static_cast<std::size_t>(Hq)), out(attn.size()), out_tail(attn.size()), future(attn.size());
  std::vector<Eigen::VectorXf> tail_mass(attn.size());
  for (int layer = 0; layer < L; ++layer) {
    auto t0 = Clock::now();
    reader_.read_layer(request_id, Tensor::K, layer, kbuf);
    reader_.read_layer(request_id, Tensor::V, layer, vbuf);
    reader_.read_layer(request_id, Tensor::Q, layer, qbuf);
    read_s += since(t0);
    t0 = Clock::now();

    std::vector<StridedMap> kh, vh;
    for (int kv = 0; kv < Hkv; ++kv) {
      kh.emplace_back(kbuf.data() + kv * d, T, d, Eigen::OuterStride<>(Hkv * d));
      vh.emplace_back(vbuf.data() + kv * d, T, d, Eigen::OuterStride<>(Hkv * d));
      keys[static_cast<std::size_t>(kv)] = kh.back().topRows(c);
      values[static_cast<std::size_t>(kv)] = vh.back().topRows(c);
      full_v[static_cast<std::size_t>(kv)] = vh.back();
    }
    // Shared by every config: full attention of the evaluation queries, outputs, tail parts.

#pragma omp parallel for schedule(dynamic)
    for (int qh = 0; qh < Hq; ++qh) {
      const auto i = static_cast<std::size_t>(qh);
      const StridedMap qe(qbuf.data() + (first_eval * Hq + qh) * d, E, d, Eigen::OuterStride<>(Hq * d));
      attn[i] = (qe * kh[static_cast<std::size_t>(qh / G)].transpose()) / std::sqrt(static_cast<float>(d));
      causal_softmax(attn[i], eval_limit);
      const Mat& v = full_v[static_cast<std::size_t>(qh / G)];
      out[i] = attn[i] * v;
      out_tail[i] = attn[i].rightCols(T - c) * v.bottomRows(T - c);
      tail_mass[i] = attn[i].rightCols(T - c).rowwise().sum();
      future[i] = attn[i].leftCols(c);
    }
    attention_s += since(t0);
    t0 = Clock::now();
    const ReplaySignals signals(g, layer, c, h, qbuf, keys, values, future);

    const LayerWork work{g, layer, c, E, T, eval_limit, signals, attn, out, out_tail, tail_mass, full_v};
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
    std::vector<std::optional<OneShot>> planned(P);
#pragma omp parallel for schedule(dynamic)
    for (std::size_t p = 0; p < P; ++p)
      guard([&] { planned[p] = plan_config(p, configs_[p], budget_tokens[p], work, acc[p]); });
    if (failure) std::rethrow_exception(failure);
    std::vector<OneShot> shots;
    for (auto& s : planned)
      if (s) shots.push_back(std::move(*s));
    // Phase B: one-shot configs share partial outputs along a spanning tree per KV head.
    // (Per query head: identical trees within a group unless a plan keeps per-query-head sets;
    // building them is a negligible popcount pass.)
    std::vector<BuildOrder> trees(static_cast<std::size_t>(Hq));
    for (int qh = 0; qh < Hq; ++qh) trees[static_cast<std::size_t>(qh)] = spanning_tree(shots, qh, c);
    std::vector<std::vector<std::vector<double>>> rec(static_cast<std::size_t>(Hq)), err(rec.size());
#pragma omp parallel for schedule(dynamic)
    for (int qh = 0; qh < Hq; ++qh) {
      rec[static_cast<std::size_t>(qh)].resize(shots.size());
      err[static_cast<std::size_t>(qh)].resize(shots.size());
      guard([&] {
        score_shots(work, shots, trees[static_cast<std::size_t>(qh)], qh, rec[static_cast<std::size_t>(qh)],
                    err[static_cast<std::size_t>(qh)]);
      });
    }
    if (failure) std::rethrow_exception(failure);
    for (std::size_t k = 0; k < shots.size(); ++k)
      for (int qh = 0; qh < Hq; ++qh)
        for (std::int64_t i = 0; i < E; ++i)
          acc[shots[k].config].add_row(layer, rec[static_cast<std::size_t>(qh)][k][static_cast<std::size_t>(i)],
                                       err[static_cast<std::size_t>(qh)][k][static_cast<std::size_t>(i)]);
    config_s += since(t0);
  }

  RequestResult result;
  result.request = request_id;
  result.tokens = T;
  result.compression_point = c;
  result.eval_queries = E;
  result.read_seconds = read_s;
  result.attention_seconds = attention_s;
  result.config_seconds = config_s;
  // Per layer and query head: Q K^T and A V over all T keys, plus the tail product.
  result.attention_flops = static_cast<double>(L) * Hq * 2.0 * static_cast<double>(E) * d *
                           (2.0 * static_cast<double>(T) + static_cast<double>(T - c));
  const double LH = static_cast<double>(L) * Hkv;
  for (std::size_t p = 0; p < P; ++p) {
    Accumulator& a = acc[p];
    ConfigResult r;
    r.budget_tokens = budget_tokens[p];
    std::vector<float> all_kl, all_err;
    for (int l = 0; l < L; ++l) {
      const auto li = static_cast<std::size_t>(l);
      all_kl.insert(all_kl.end(), a.kl[li].begin(), a.kl[li].end());
      all_err.insert(all_err.end(), a.err[li].begin(), a.err[li].end());
      r.layer_p95_kl.push_back(percentile95(a.kl[li]));
      r.layer_p95_err.push_back(percentile95(a.err[li]));
    }
    r.rows = static_cast<std::int64_t>(all_kl.size());
    double sr = 0, sk = 0, se = 0;
    for (int l = 0; l < L; ++l) {
      const auto li = static_cast<std::size_t>(l);
      const double n = static_cast<double>(a.layer_rows[li]);
      sr += a.layer_recall[li];
      sk += a.layer_kl[li];
      se += a.layer_err[li];
      r.layer_recall.push_back(a.layer_recall[li] / n);
      r.layer_kl.push_back(a.layer_kl[li] / n);
      r.layer_err.push_back(a.layer_err[li] / n);
    }
    r.mean_recall = sr / static_cast<double>(r.rows);
    r.mean_kl = sk / static_cast<double>(r.rows);
    r.mean_err = se / static_cast<double>(r.rows);
    r.p95_kl = percentile95(all_kl);
    r.p95_err = percentile95(all_err);
    const double bpt = token_bytes[p];
    // Per-entry fixed state (length tables), counted for every layer and plan entry.
    const double fixed = head_bytes[p] * static_cast<double>(L) * static_cast<double>(a.entries);
    const double kept = static_cast<double>(a.kept), tail = static_cast<double>(T - c), cd = static_cast<double>(c);
    r.kept_fraction = kept / (LH * cd);
    r.compressed_bytes = kept * bpt + fixed;
    r.budget_bytes = configs_[p].budget * cd * LH * kv_token_bytes;
    // Prefill grows the cache to c tokens, compression cuts it, then each step adds a token
    // (and decode-time policies evict back to budget); the newest token is always present
    // during its own step, hence the +LH transient for evicting policies.
    r.final_bytes = fixed + (a.kept_after_step.empty() ? kept * bpt : a.kept_after_step.back() * bpt);
    r.peak_bytes = cd * LH * bpt;
    r.footprint = LH * bpt * cd * (cd + 1) / 2;
    double prev = kept;
    for (double k : a.kept_after_step) {
      r.peak_bytes = std::max(r.peak_bytes, std::max(k, prev + LH) * bpt + fixed);
      r.footprint += k * bpt + fixed;
      prev = k;
    }
    (void)tail;
    r.keep_hash = a.hash;
    if (configs_[p].impl->respects_budget() && configs_[p].budget < 1.0 && r.compressed_bytes > r.budget_bytes + 1e-6)
      throw Error("policy " + configs_[p].label() + " kept " + std::to_string(r.compressed_bytes) +
                  " bytes over budget " + std::to_string(r.budget_bytes) + " in " + ctx + " (a policy bug)");
    result.configs.push_back(std::move(r));
  }
  return result;
}

}  // namespace kvsim
