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

CacheView gather_view(std::vector<std::vector<std::int32_t>> tokens, const std::vector<Mat>& full_k,
                      const std::vector<Mat>& full_v, const std::vector<Mat>& attn, int group) {
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
    Mat f(attn[qh].rows(), static_cast<Eigen::Index>(t.size()));
    for (Eigen::Index i = 0; i < f.rows(); ++i)
      for (Eigen::Index m = 0; m < f.cols(); ++m) f(i, m) = attn[qh](i, t[static_cast<std::size_t>(m)]);
    v.future.push_back(std::move(f));
  }
  return v;
}

}  // namespace kvsim::kvcache
