#include "policies/lowrank.h"

#include <Eigen/Dense>
#include <algorithm>

#include "core/error.h"
#include "core/half.h"

namespace kvsim {

namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

float fp16(float x) { return half_to_float(float_to_half(x)); }

RowMat unrotated_keys(const KvGeometry& g, std::span<const float> keys, std::span<const std::int32_t> positions) {
  const auto n = static_cast<Eigen::Index>(positions.size());
  RowMat k = Eigen::Map<const RowMat>(keys.data(), n, g.head_dim);
  for (Eigen::Index j = 0; j < n; ++j) apply_rope(g.rope, k.row(j).data(), 1, positions[static_cast<std::size_t>(j)], true);
  return k;
}

// Eigenvectors of X^T X by decreasing eigenvalue (the right singular vectors of X), fp16-rounded.
std::vector<float> principal_directions(const RowMat& x) {
  const Eigen::MatrixXd gram = (x.cast<double>().transpose() * x.cast<double>());
  const Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> es(gram);
  const auto d = static_cast<Eigen::Index>(gram.rows());
  std::vector<float> u(static_cast<std::size_t>(d * d));
  for (Eigen::Index r = 0; r < d; ++r)  // eigenvalues come increasing: column r = eigenvector d-1-r
    for (Eigen::Index i = 0; i < d; ++i)
      u[static_cast<std::size_t>(i * d + r)] = fp16(static_cast<float>(es.eigenvectors()(i, d - 1 - r)));
  return u;
}

}  // namespace

HeadBasis fit_basis(const KvGeometry& g, std::span<const float> keys, std::span<const float> values,
                    std::span<const std::int32_t> positions) {
  const auto n = static_cast<Eigen::Index>(positions.size());
  HeadBasis b;
  b.d = g.head_dim;
  b.uk = principal_directions(unrotated_keys(g, keys, positions));
  b.uv = principal_directions(Eigen::Map<const RowMat>(values.data(), n, g.head_dim));
  return b;
}

void project(const KvGeometry& g, const HeadBasis& b, std::span<const float> keys, std::span<const float> values,
             std::span<const std::int32_t> positions, std::vector<float>& ck, std::vector<float>& cv) {
  const auto n = static_cast<Eigen::Index>(positions.size());
  const Eigen::Map<const RowMat> uk(b.uk.data(), b.d, b.d), uv(b.uv.data(), b.d, b.d);
  const RowMat k = unrotated_keys(g, keys, positions);
  RowMat a = k * uk, c = Eigen::Map<const RowMat>(values.data(), n, b.d) * uv;
  ck.assign(a.data(), a.data() + a.size());
  cv.assign(c.data(), c.data() + c.size());
  for (auto& x : ck) x = fp16(x);
  for (auto& x : cv) x = fp16(x);
}

double lowrank_bytes(const HeadPlan& plan, int head_dim) {
  double bytes = 0;
  bool any = false;
  for (std::size_t j = 0; j < plan.codec.size(); ++j) {
    if (plan.codec[j] == TokenCodec::Fp16) bytes += codec_token_bytes(TokenCodec::Fp16, head_dim);
    if (plan.codec[j] != TokenCodec::LowRank) continue;
    any = true;
    bytes += 2.0 * 2.0 * plan.rank.at(j) + 1.0;
  }
  return bytes + (any ? 2.0 * 2.0 * head_dim * head_dim : 0.0);
}

void LowRankCodec::reconstruct(const HeadPlan& plan, const KvGeometry& g, std::span<const std::int32_t> positions,
                               std::span<float> keys, std::span<float> values) const {
  const int d = g.head_dim;
  const HeadBasis b = fit_basis(g, keys, values, positions);
  std::vector<float> ck, cv;
  project(g, b, keys, values, positions, ck, cv);
  const Eigen::Map<const RowMat> uk(b.uk.data(), d, d), uv(b.uv.data(), d, d);
  std::size_t row = 0;
  for (std::size_t j = 0; j < plan.codec.size(); ++j) {
    if (plan.codec[j] == TokenCodec::Drop) continue;
    if (plan.codec[j] == TokenCodec::LowRank) {
      const Eigen::Index r = std::min<Eigen::Index>(plan.rank.at(j), d);
      const auto at = static_cast<Eigen::Index>(row) * d;
      Eigen::Map<Eigen::RowVectorXf> k(keys.data() + at, d), v(values.data() + at, d);
      k = Eigen::Map<const Eigen::RowVectorXf>(ck.data() + at, d).head(r) * uk.leftCols(r).transpose();
      v = Eigen::Map<const Eigen::RowVectorXf>(cv.data() + at, d).head(r) * uv.leftCols(r).transpose();
      apply_rope(g.rope, k.data(), 1, positions[row]);
    }
    ++row;
  }
}

}  // namespace kvsim
