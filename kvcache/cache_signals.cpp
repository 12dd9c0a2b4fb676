#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "kvcache/cache_signals.h"

namespace kvsim::kvcache {

void causal_softmax(Mat& s, const std::vector<std::int64_t>& limit, Eigen::VectorXd* lse) {
  if (lse) lse->resize(s.rows());
  for (Eigen::Index i = 0; i < s.rows(); ++i) {
    const Eigen::Index last = std::min<Eigen::Index>(limit[static_cast<std::size_t>(i)], s.cols() - 1);
    auto row = s.row(i);
    if (last < 0) {  // no cached key at or before this query (a chunk cut dropped them all)
      row.setZero();
      if (lse) (*lse)(i) = -std::numeric_limits<double>::infinity();
      continue;
    }
    const float m = row.head(last + 1).maxCoeff();
    row.head(last + 1) = (row.head(last + 1).array() - m).exp();
    const float sum = row.head(last + 1).sum();
    row.head(last + 1) /= sum;
    if (lse) (*lse)(i) = static_cast<double>(m) + std::log(static_cast<double>(sum));
    if (last + 1 < s.cols()) row.tail(s.cols() - last - 1).setZero();
  }
}

Mat CacheSignals::compute_attention(int q_head, std::int64_t first, std::int64_t count) const {
  const int Hq = g_.n_q_heads, d = g_.head_dim;
  const StridedMap q(q_.data() + (first * Hq + q_head) * d, count, d, Eigen::OuterStride<>(Hq * d));
  const auto kv = static_cast<std::size_t>(q_head / g_.group());
  const Mat& keys = keys_[kv];
  // Row i sees the cached tokens up to its own: the last entry not after it.
  const auto& tokens = tokens_[kv];
  std::vector<std::int64_t> limit(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i)
    limit[static_cast<std::size_t>(i)] =
        (std::upper_bound(tokens.begin(), tokens.end(), observed_[static_cast<std::size_t>(first + i)]) -
         tokens.begin()) -
        1;
  // Blocks of rows, each against the keys its rows can see only: a prompt's causal triangle is
  // half the square. Every entry is the same dot product as one full GEMM's, and causal_softmax
  // zeroes each row past its limit, so the entries left unset are never read.
  Mat s(count, keys.rows());
  constexpr std::int64_t kRows = 128;
  const float scale = std::sqrt(static_cast<float>(d));
  for (std::int64_t r0 = 0; r0 < count; r0 += kRows) {
    const std::int64_t nr = std::min(kRows, count - r0);
    std::int64_t cols = 0;
    for (std::int64_t i = r0; i < r0 + nr; ++i) cols = std::max(cols, limit[static_cast<std::size_t>(i)] + 1);
    cols = std::min<std::int64_t>(cols, keys.rows());
    if (cols > 0) s.block(r0, 0, nr, cols).noalias() = q.middleRows(r0, nr) * keys.topRows(cols).transpose();
    if (cols > 0) s.block(r0, 0, nr, cols) /= scale;
  }
  causal_softmax(s, limit);
  return s;
}

CacheView gather_view(std::vector<std::vector<std::int32_t>> tokens, const std::vector<Mat>& full_k,
                      const std::vector<Mat>& full_v, const std::vector<Mat>& attn, int group, std::int64_t first_row) {
  CacheView v;
  v.tokens = std::move(tokens);
  for (std::size_t kv = 0; kv < v.tokens.size(); ++kv) {
    const auto& t = v.tokens[kv];
    const auto n = static_cast<Eigen::Index>(t.size());
    Mat k(n, full_k[kv].cols()), val(n, full_v[kv].cols());
    for (Eigen::Index m = 0; m < n; ++m) {
      k.row(m) = full_k[kv].row(t[static_cast<std::size_t>(m)]);
      val.row(m) = full_v[kv].row(t[static_cast<std::size_t>(m)]);
    }
    v.keys.push_back(std::move(k));
    v.values.push_back(std::move(val));
  }
  for (std::size_t qh = 0; qh < attn.size(); ++qh) {
    const auto& t = v.tokens[qh / static_cast<std::size_t>(group)];
    const auto first = static_cast<Eigen::Index>(std::min<std::int64_t>(first_row, attn[qh].rows()));
    Mat f(attn[qh].rows() - first, static_cast<Eigen::Index>(t.size()));
    for (Eigen::Index i = 0; i < f.rows(); ++i)
      for (Eigen::Index m = 0; m < f.cols(); ++m) f(i, m) = attn[qh](first + i, t[static_cast<std::size_t>(m)]);
    v.future.push_back(std::move(f));
  }
  return v;
}

}  // namespace kvsim::kvcache
