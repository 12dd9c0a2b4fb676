#pragma once
// Policy signals over a cache at a compression point, shared by offline replay and live verify.
// Eigen stays in the sources that include this (sim/, verify/), out of the public headers.
#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <future>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "policies/policy.h"

namespace kvsim::kvcache {

using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using StridedMap = Eigen::Map<const Mat, 0, Eigen::OuterStride<>>;
// Layer buffers aligned like Eigen's own storage, so vectorised kernels take the same path
// whatever address the allocator returns (bit-reproducible runs).
using FloatBuffer = std::vector<float, Eigen::aligned_allocator<float>>;

// The request as policies see it: every token's position and segment code, and the tokens whose
// queries were recorded (increasing; row r of a layer's query buffer is token q_index[r]).
struct RequestTokens {
  std::span<const std::int32_t> positions;
  std::span<const std::int8_t> segments;
  std::span<const std::int32_t> q_index;
};

// Row-wise causal softmax in place: row i may see keys [0, limit[i]]; the rest become 0. With
// lse, also each row's logsumexp over the keys it sees (-inf for a row that sees none).
void causal_softmax(Mat& s, const std::vector<std::int64_t>& limit, Eigen::VectorXd* lse = nullptr);

// The cache at one compression point: per KV head the tokens it holds (increasing) and their
// K/V rows; per query head the evaluation rows' attention restricted to them (the oracle signal).
struct CacheView {
  std::vector<std::vector<std::int32_t>> tokens;  // [Hkv]
  std::vector<Mat> keys, values;                  // [Hkv], one row per cached token
  std::vector<Mat> future;                        // [Hq], E x cached tokens of its KV head
  const RepeatPassView* repeat = nullptr;         // KVzip's reconstruction pass, when recorded
};

// Gathers a CacheView for `tokens` from a layer's full K/V ([T, d] per KV head) and the
// evaluation rows' attention ([E, T] per query head). The future is the rows from `first_row` on:
// at a decode step, only the queries still to come.
CacheView gather_view(std::vector<std::vector<std::int32_t>> tokens, const std::vector<Mat>& full_k,
                      const std::vector<Mat>& full_v, const std::vector<Mat>& attn, int group,
                      std::int64_t first_row = 0);

// One layer of one request, as policies see it at a compression point after n tokens: the
// cache's tokens and K/V per KV head, the recorded queries, attention computed on demand. The
// same class serves offline replay (built from a trace) and live verify (built from the
// engine's cache), so both hand policies identical signals for identical inputs.
class CacheSignals final : public LayerSignals {
 public:
  // `where` names the trace (or live run) and request in error messages. `view.future` may be
  // empty (live): future_attention() then throws.
  CacheSignals(std::string where, const ModelGeometry& g, int layer, std::int64_t n, const RequestTokens& h,
               const FloatBuffer& q, const CacheView& view)
      : where_(std::move(where)),
        g_(g),
        layer_(layer),
        c_(n),
        h_(h),
        q_(q),
        keys_(view.keys),
        values_(view.values),
        future_(view.future),
        tokens_(view.tokens),
        repeat_(view.repeat) {
    for (std::size_t r = 0; r < h.q_index.size() && h.q_index[r] < n; ++r) observed_.push_back(h.q_index[r]);
  }
  const ModelGeometry& geometry() const override { return g_; }
  int layer() const override { return layer_; }
  std::int64_t n_tokens() const override { return c_; }
  std::span<const std::int32_t> positions() const override {
    return {h_.positions.data(), static_cast<std::size_t>(c_)};
  }
  std::span<const std::int8_t> segments() const override { return {h_.segments.data(), static_cast<std::size_t>(c_)}; }
  std::span<const std::int32_t> cached(int kv_head) const override {
    return tokens_[static_cast<std::size_t>(kv_head)];
  }
  const RepeatPassView* repeat_pass() const override { return repeat_; }
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
      throw Error(where_ + ": needs prompt queries before the compression point (token " + std::to_string(c_) +
                  "), but the trace recorded none there");
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
  // Blocks of at most kBlockFloats floats (16 MB), computed one at a time; a matrix small enough
  // to keep is one block, the one observed_attention() keeps.
  void visit_observed_attention(int q_head,
                                const std::function<void(std::int64_t, const MatrixView&)>& visit) const override {
    const auto m = static_cast<std::int64_t>(observed_.size());
    const auto n = static_cast<std::int64_t>(tokens_[static_cast<std::size_t>(q_head / g_.group())].size());
    if (m == 0 || m * n <= (std::int64_t{1} << 20)) {
      const OwnedMatrix a = observed_attention(q_head);
      visit(0, a.view());
      return;
    }
    const std::int64_t step = std::max<std::int64_t>(1, kBlockFloats / std::max<std::int64_t>(n, 1));
    for (std::int64_t first = 0; first < m; first += step) {
      const Mat block = compute_attention(q_head, first, std::min(step, m - first));
      visit(first, view(block));
    }
  }
  static constexpr std::int64_t kBlockFloats = std::int64_t{1} << 22;
  std::span<const std::int32_t> observed_rows() const override { return observed_; }
  MatrixView observed_queries(int q_head) const override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find({q_head, -1});
    if (it == cache_.end()) {
      const int Hq = g_.n_q_heads, d = g_.head_dim;
      const auto m = static_cast<Eigen::Index>(observed_.size());
      it = cache_
               .emplace(std::make_pair(q_head, -1),
                        Mat(StridedMap(q_.data() + q_head * d, m, d, Eigen::OuterStride<>(Hq * d))))
               .first;
    }
    return view(it->second);
  }
  MatrixView future_attention(int q_head) const override {
    if (future_.empty())
      throw Error(where_ +
                  ": future attention is an offline oracle (the queries after the compression point); "
                  "a live run cannot provide it");
    return view(future_[static_cast<std::size_t>(q_head)]);
  }
  std::shared_ptr<const void> memo(const void* owner,
                                   const std::function<std::shared_ptr<const void>()>& make) const override {
    // The first caller computes, outside the lock (make() may need the signals); callers that
    // arrive meanwhile (the same policy at another budget, on another thread) wait for it
    // instead of computing it again.
    std::promise<std::shared_ptr<const void>> promise;
    std::shared_future<std::shared_ptr<const void>> value;
    bool mine = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const auto it = memo_.find(owner);
      if (it != memo_.end()) {
        value = it->second;
      } else {
        value = promise.get_future().share();
        memo_.emplace(owner, value);
        mine = true;
      }
    }
    if (mine) {
      try {
        promise.set_value(make());
      } catch (...) {
        promise.set_exception(std::current_exception());
      }
    }
    return value.get();
  }

 private:
  static MatrixView view(const Mat& m) { return {m.data(), m.rows(), m.cols()}; }

  // Causal attention of observed rows [first, first + count) over the c cached keys.
  Mat compute_attention(int q_head, std::int64_t first, std::int64_t count) const;
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
  const ModelGeometry& g_;
  int layer_;
  std::int64_t c_;
  RequestTokens h_;
  const FloatBuffer& q_;
  const std::vector<Mat>& keys_;
  const std::vector<Mat>& values_;
  const std::vector<Mat>& future_;
  const std::vector<std::vector<std::int32_t>>& tokens_;
  const RepeatPassView* repeat_;
  std::vector<std::int32_t> observed_;
  mutable std::mutex mu_;
  mutable std::map<std::pair<int, int>, Mat> cache_;
  mutable std::map<const void*, std::shared_future<std::shared_ptr<const void>>> memo_;
};

}  // namespace kvsim::kvcache
