#pragma once
// Internals of the replay engine (sim/replay_*.cpp only): shared types and the steps of one
// layer. Eigen stays here, out of sim/replay.h.
#include <Eigen/Dense>
#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "policies/policy.h"
#include "sim/replay.h"
#include "traces/trace_schema.h"

namespace kvsim::replay_detail {


using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using StridedMap = Eigen::Map<const Mat, 0, Eigen::OuterStride<>>;
// Layer buffers aligned like Eigen's own storage, so vectorised kernels take the same path
// whatever address the allocator returns (bit-reproducible runs).
using FloatBuffer = std::vector<float, Eigen::aligned_allocator<float>>;

// Row-wise causal softmax in place: row i may see keys [0, limit[i]]; the rest become 0.
void causal_softmax(Mat& s, const std::vector<std::int64_t>& limit);

// The cache at one compression point: per KV head the tokens it holds (increasing) and their
// K/V rows; per query head the evaluation rows' attention restricted to them (the oracle signal).
struct CacheView {
  std::vector<std::vector<std::int32_t>> tokens;  // [Hkv]
  std::vector<Mat> keys, values;                  // [Hkv], one row per cached token
  std::vector<Mat> future;                        // [Hq], E x cached tokens of its KV head
};

// Gathers a CacheView for `tokens` from a layer's full K/V ([T, d] per KV head) and the
// evaluation rows' attention ([E, T] per query head).
CacheView gather_view(std::vector<std::vector<std::int32_t>> tokens, const std::vector<Mat>& full_k,
                      const std::vector<Mat>& full_v, const std::vector<Mat>& attn, int group);

// One layer of one request, as policies see it at a compression point after n tokens.
class ReplaySignals final : public LayerSignals {
 public:
  // `where` names the trace and request in error messages.
  ReplaySignals(std::string where, const KvGeometry& g, int layer, std::int64_t n, const RequestHeader& h,
                const FloatBuffer& q, const CacheView& view)
      : where_(std::move(where)), g_(g), layer_(layer), c_(n), h_(h), q_(q), keys_(view.keys), values_(view.values),
        future_(view.future), tokens_(view.tokens) {
    for (std::size_t r = 0; r < h.q_index.size() && h.q_index[r] < n; ++r) observed_.push_back(h.q_index[r]);
  }
  const KvGeometry& geometry() const override { return g_; }
  int layer() const override { return layer_; }
  std::int64_t n_tokens() const override { return c_; }
  std::span<const std::int32_t> positions() const override {
    return {h_.positions.data(), static_cast<std::size_t>(c_)};
  }
  std::span<const std::int8_t> segments() const override { return {h_.segments.data(), static_cast<std::size_t>(c_)}; }
  std::span<const std::int32_t> cached(int kv_head) const override { return tokens_[static_cast<std::size_t>(kv_head)]; }
  MatrixView keys(int kv_head) const override { return view(keys_[static_cast<std::size_t>(kv_head)]); }
  MatrixView values(int kv_head) const override { return view(values_[static_cast<std::size_t>(kv_head)]); }

  MatrixView window_attention(int q_head, int window) const override {
    if (window > c_) window = static_cast<int>(c_);
    // The window's queries are the last `window` observed rows, which must be exactly the last
    // `window` tokens before the compression point.
    const auto m = static_cast<std::int64_t>(observed_.size());
    if (m < window || observed_[static_cast<std::size_t>(m - window)] != c_ - window)
      throw Error(where_ + ": needs the queries of the last " + std::to_string(window) +
                  " tokens before the compression point (token " + std::to_string(c_) +
                  "), but the trace did not record them all; capture with more queries (e.g. kvsim trace synth "
                  "--queries all, or a larger --query-window)");
    return attention(q_head, m - window, window, 1000 + window);
  }
  OwnedMatrix observed_attention(int q_head) const override {
    if (observed_.empty())
      throw Error(where_ + ": needs prompt queries before the compression point (token " +
                  std::to_string(c_) + "), but the trace recorded none there");
    const auto m = static_cast<std::int64_t>(observed_.size());
    const auto n = static_cast<std::int64_t>(tokens_[static_cast<std::size_t>(q_head / g_.group())].size());
    // Small enough (a few recorded rows): keep it for the other policies of this layer; all of
    // a long prompt's rows would be n x n per head, so those are recomputed per call instead.
    if (m * n <= (std::int64_t{1} << 20)) {
      const MatrixView v = attention(q_head, 0, m, -2);
      return OwnedMatrix{std::vector<float>(v.data, v.data + v.rows * v.cols), v.rows, v.cols};
    }
    const Mat s = compute_attention(q_head, 0, m);
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
    const auto kv = static_cast<std::size_t>(q_head / g_.group());
    Mat s = (q * keys_[kv].transpose()) / std::sqrt(static_cast<float>(d));
    // Row i sees the cached tokens up to its own: the last entry not after it.
    const auto& tokens = tokens_[kv];
    std::vector<std::int64_t> limit(static_cast<std::size_t>(count));
    for (std::int64_t i = 0; i < count; ++i)
      limit[static_cast<std::size_t>(i)] =
          (std::upper_bound(tokens.begin(), tokens.end(), observed_[static_cast<std::size_t>(first + i)]) - tokens.begin()) - 1;
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

  std::string where_;
  const KvGeometry& g_;
  int layer_;
  std::int64_t c_;
  const RequestHeader& h_;
  const FloatBuffer& q_;
  const std::vector<Mat>& keys_;
  const std::vector<Mat>& values_;
  const std::vector<Mat>& future_;
  const std::vector<std::vector<std::int32_t>>& tokens_;
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
  std::vector<double> prefill_size;         // [c] cache size at each prefill step (all layers, heads)
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
  std::int64_t prefill_chunk;                     // 0: one compression at c; else also every this many tokens
  const std::string& where;
  const RequestHeader& h;
  const FloatBuffer& q;                           // this layer's recorded queries
  const std::vector<Mat>& full_k;                 // [Hkv] T x d
  const std::vector<std::int64_t>& eval_tokens;  // [E] token index of each evaluation row
  const ReplaySignals& signals;
  const std::vector<Mat>& attn;       // [Hq] full attention of the evaluation rows, E x T
  const std::vector<Mat>& out;        // [Hq] full attention outputs, E x d
  const std::vector<Mat>& out_tail;   // [Hq] part of out from tokens >= c (never compressed here)
  const std::vector<Eigen::VectorXf>& tail_mass;
  const std::vector<Mat>& full_v;     // [Hkv] T x d
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

// Phase A of a layer for one config (replay_shots.cpp).
std::optional<OneShot> plan_config(std::size_t index, const ReplayConfig& cfg, std::int64_t budget_tokens,
                                   const LayerWork& w, Accumulator& a);
// Decode-time configs (replay_decode.cpp).
void replay_decode(const ReplayConfig& cfg, std::int64_t budget_tokens, const LayerWork& w, const LayerPlan& plan,
                   DecodeState& state, Accumulator& a);
// Phase B (replay_shots.cpp).
BuildOrder spanning_tree(const std::vector<OneShot>& shots, int q_head, std::int64_t c);
void score_shots(const LayerWork& w, const std::vector<OneShot>& shots, const BuildOrder& tree, int q_head,
                 std::vector<std::vector<double>>& recall_out, std::vector<std::vector<double>>& err_out);

}  // namespace kvsim::replay_detail
