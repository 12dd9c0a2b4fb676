#include "policies/lowrank.h"

#include <Eigen/Dense>
#include <algorithm>

#include "core/error.h"
#include "core/half.h"

namespace kvsim {

namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

float fp16(float x) { return half_to_float(float_to_half(x)); }

// Rounds to fp16 values in bulk (the vectorised conversion): coefficients are n x d per head.
void round_half(std::vector<float>& x) {
  std::vector<std::uint16_t> h(x.size());
  floats_to_halves(x.data(), h.data(), x.size());
  halves_to_floats(h.data(), x.data(), x.size());
}

// Low-rank reconstruction rotates every cached key twice per config: the cosines and sines come
// from a per-thread table (same values as apply_rope).
RopeTable& rope_table(const RopeSpec& s) {
  thread_local std::vector<RopeTable> tables;
  for (auto& t : tables)
    if (t.spec().type == s.type && t.spec().head_dim == s.head_dim && t.spec().rope_dim == s.rope_dim &&
        t.spec().theta == s.theta)
      return t;
  tables.emplace_back(s);
  return tables.back();
}

RowMat unrotated_keys(const KvGeometry& g, std::span<const float> keys, std::span<const std::int32_t> positions) {
  const auto n = static_cast<Eigen::Index>(positions.size());
  RowMat k = Eigen::Map<const RowMat>(keys.data(), n, g.head_dim);
  RopeTable& rope = rope_table(g.rope);
  for (Eigen::Index j = 0; j < n; ++j) rope.apply(k.row(j).data(), 1, positions[static_cast<std::size_t>(j)], true);
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

namespace {

// Bases and coefficients from keys already un-rotated (the costly part, done once).
void fit_and_project(const RowMat& k, const Eigen::Map<const RowMat>& v, HeadBasis& b, std::vector<float>* ck,
                     std::vector<float>* cv) {
  b.d = static_cast<int>(k.cols());
  b.uk = principal_directions(k);
  b.uv = principal_directions(v);
  if (!ck) return;
  const Eigen::Map<const RowMat> uk(b.uk.data(), b.d, b.d), uv(b.uv.data(), b.d, b.d);
  const RowMat a = k * uk, c = v * uv;
  ck->assign(a.data(), a.data() + a.size());
  cv->assign(c.data(), c.data() + c.size());
  round_half(*ck);
  round_half(*cv);
}

}  // namespace

HeadBasis fit_basis(const KvGeometry& g, std::span<const float> keys, std::span<const float> values,
                    std::span<const std::int32_t> positions, std::vector<float>* ck, std::vector<float>* cv) {
  const auto n = static_cast<Eigen::Index>(positions.size());
  HeadBasis b;
  fit_and_project(unrotated_keys(g, keys, positions), Eigen::Map<const RowMat>(values.data(), n, g.head_dim), b, ck, cv);
  return b;
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
  std::vector<float> ck, cv;
  const HeadBasis b = fit_basis(g, keys, values, positions, &ck, &cv);
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
      rope_table(g.rope).apply(k.data(), 1, positions[row]);
    }
    ++row;
  }
}

}  // namespace kvsim
