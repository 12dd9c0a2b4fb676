#include "policies/lowrank.h"

#include <Eigen/Dense>
#include <algorithm>

#include "core/error.h"
#include "core/half.h"
#include "core/packed_kv.h"
#include "policies/basis_set.h"
#include "policies/scratch_matrix.h"

namespace kvsim {

namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

float fp16(float x) { return half_to_float(float_to_half(x)); }

// Rounds to fp16 values in bulk (the vectorised conversion): coefficients are n x d per head.
void round_half(std::vector<float>& x) { round_to_half(x.data(), x.size()); }

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

// g.rope, although the codec API carries no layer: codecs only run on layers that compress, and
// a sliding-window layer (gemma3's, rotated with rope_theta_local) never does, so every layer a
// codec sees rotates with the model's own base.
RowMat unrotated_keys(const ModelGeometry& g, std::span<const float> keys, std::span<const std::int32_t> positions) {
  const auto n = static_cast<Eigen::Index>(positions.size());
  RowMat k = Eigen::Map<const RowMat>(keys.data(), n, g.head_dim);
  RopeTable& rope = rope_table(g.rope);
  for (Eigen::Index j = 0; j < n; ++j) rope.apply(k.row(j).data(), 1, positions[static_cast<std::size_t>(j)], true);
  return k;
}

// Eigenvectors of a Gram matrix by decreasing eigenvalue, fp16-rounded, [d, d] row-major.
std::vector<float> directions_of(const Eigen::MatrixXd& gram) {
  const Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> es(gram);
  const auto d = static_cast<Eigen::Index>(gram.rows());
  std::vector<float> u(static_cast<std::size_t>(d * d));
  for (Eigen::Index r = 0; r < d; ++r)  // eigenvalues come increasing: column r = eigenvector d-1-r
    for (Eigen::Index i = 0; i < d; ++i)
      u[static_cast<std::size_t>(i * d + r)] = fp16(static_cast<float>(es.eigenvectors()(i, d - 1 - r)));
  return u;
}

// Eigenvectors of X^T X (the right singular vectors of X).
std::vector<float> principal_directions(const RowMat& x) {
  Eigen::MatrixXd gram = Eigen::MatrixXd::Zero(x.cols(), x.cols());
  // Float rank updates (half a GEMM) over row blocks, summed in double across blocks: float sums
  // of 256 rows are good to ~1e-6 relative, far below the basis's fp16 rounding, at a quarter of
  // a double GEMM's cost.
  constexpr Eigen::Index block = 256;
  Eigen::MatrixXf gb(x.cols(), x.cols());
  for (Eigen::Index b = 0; b < x.rows(); b += block) {
    gb.setZero();
    gb.selfadjointView<Eigen::Lower>().rankUpdate(x.middleRows(b, std::min(block, x.rows() - b)).transpose());
    gram.triangularView<Eigen::Lower>() += gb.cast<double>();
  }
  return directions_of(gram);  // the solver reads the lower triangle
}

}  // namespace

namespace {

// Bases and coefficients from keys already un-rotated (the costly part, done once).
void fit_and_project(const RowMat& k, const Eigen::Map<const RowMat>& v, HeadBasis& b, std::vector<float>* ck,
                     std::vector<float>* cv, const HeadBasis* fixed = nullptr) {
  b.d = static_cast<int>(k.cols());
  if (fixed) {
    if (fixed->d != b.d)
      throw Error("low-rank basis of dimension " + std::to_string(fixed->d) + " for head_dim " + std::to_string(b.d));
    b = *fixed;
  } else {
    b.uk = principal_directions(k);
    b.uv = principal_directions(v);
  }
  if (!ck) return;
  const Eigen::Map<const RowMat> uk(b.uk.data(), b.d, b.d), uv(b.uv.data(), b.d, b.d);
  // Projected straight into the fit's vectors: no n x d temporaries to map, fault in and copy.
  ck->resize(static_cast<std::size_t>(k.size()));
  cv->resize(static_cast<std::size_t>(v.size()));
  Eigen::Map<RowMat>(ck->data(), k.rows(), b.d).noalias() = k * uk;
  Eigen::Map<RowMat>(cv->data(), v.rows(), b.d).noalias() = v * uv;
  round_half(*ck);
  round_half(*cv);
}

}  // namespace

HeadBasis fit_basis(const ModelGeometry& g, std::span<const float> keys, std::span<const float> values,
                    std::span<const std::int32_t> positions, std::vector<float>* ck, std::vector<float>* cv) {
  const auto n = static_cast<Eigen::Index>(positions.size());
  HeadBasis b;
  fit_and_project(unrotated_keys(g, keys, positions), Eigen::Map<const RowMat>(values.data(), n, g.head_dim), b, ck,
                  cv);
  return b;
}

void GramAccumulator::add(const ModelGeometry& g, std::span<const float> keys, std::span<const float> values,
                          std::span<const std::int32_t> positions) {
  if (d == 0) {
    d = g.head_dim;
    kk.assign(static_cast<std::size_t>(d * d), 0.0);
    vv.assign(kk.size(), 0.0);
  }
  const auto n = static_cast<Eigen::Index>(positions.size());
  const Eigen::MatrixXd k = unrotated_keys(g, keys, positions).cast<double>();
  const Eigen::MatrixXd v = Eigen::Map<const RowMat>(values.data(), n, d).cast<double>();
  Eigen::Map<Eigen::MatrixXd>(kk.data(), d, d) += k.transpose() * k;
  Eigen::Map<Eigen::MatrixXd>(vv.data(), d, d) += v.transpose() * v;
  tokens += n;
}

HeadBasis GramAccumulator::basis() const {
  HeadBasis b;
  b.d = d;
  b.uk = directions_of(Eigen::Map<const Eigen::MatrixXd>(kk.data(), d, d));
  b.uv = directions_of(Eigen::Map<const Eigen::MatrixXd>(vv.data(), d, d));
  return b;
}

std::shared_ptr<const LowRankFit> fit_lowrank(const ModelGeometry& g, std::span<const float> keys,
                                              std::span<const float> values, std::span<const std::int32_t> positions,
                                              const HeadBasis* fixed) {
  auto fit = std::make_shared<LowRankFit>();
  fit->n = static_cast<std::int64_t>(positions.size());
  fit_and_project(unrotated_keys(g, keys, positions), Eigen::Map<const RowMat>(values.data(), fit->n, g.head_dim),
                  fit->basis, &fit->ck, &fit->cv, fixed);
  return fit;
}

std::vector<std::shared_ptr<const LowRankFit>> layer_fits(const LayerSignals& s,
                                                          const std::shared_ptr<const BasisSet>& calibration_set) {
  // The memo keeps the set alive with its fits, so no other set can take its address (the key)
  // while the memo lasts.
  struct Fits {
    std::shared_ptr<const BasisSet> set;
    std::vector<std::shared_ptr<const LowRankFit>> heads;
  };
  const BasisSet* calibration = calibration_set.get();
  static const char request_fit = 0;  // the memo key of bases fitted on the request itself
  const void* key = calibration ? static_cast<const void*>(calibration) : &request_fit;
  const auto memo = s.memo(key, [&] {
    const ModelGeometry& g = s.geometry();
    if (calibration) check_basis_set(*calibration, g);
    auto fits = std::make_shared<Fits>();
    fits->set = calibration_set;
    for (int kv = 0; kv < g.n_kv_heads; ++kv) {
      const MatrixView K = s.keys(kv), V = s.values(kv);
      std::vector<std::int32_t> pos;
      for (auto t : s.cached(kv)) pos.push_back(s.positions()[static_cast<std::size_t>(t)]);
      auto fit = fit_lowrank(g, {K.data, static_cast<std::size_t>(K.rows * K.cols)},
                             {V.data, static_cast<std::size_t>(V.rows * V.cols)}, pos,
                             calibration ? &calibration->at(s.layer(), kv) : nullptr);
      if (calibration) std::const_pointer_cast<LowRankFit>(fit)->charge = BasisCharge{true, calibration->serves};
      fits->heads.push_back(std::move(fit));
    }
    return std::static_pointer_cast<const void>(std::shared_ptr<const Fits>(std::move(fits)));
  });
  return static_cast<const Fits*>(memo.get())->heads;
}

double lowrank_cost(std::int64_t k, double coefficients, bool ranks_differ, int r_max, int head_dim,
                    const BasisCharge& charge) {
  if (k <= 0) return 0.0;
  return 4.0 * coefficients + (ranks_differ ? static_cast<double>(k) : 0.0) + charge.bytes(head_dim, r_max);
}

double lowrank_bytes(const HeadPlan& plan, int head_dim) {
  double fp16 = 0, coefficients = 0;
  std::int64_t k = 0;
  int r_min = head_dim, r_max = 0;
  for (std::size_t j = 0; j < plan.codec.size(); ++j) {
    if (plan.codec[j] == TokenCodec::Fp16) fp16 += codec_token_bytes(TokenCodec::Fp16, head_dim);
    if (plan.codec[j] != TokenCodec::LowRank) continue;
    const int r = std::min<int>(plan.rank.at(j), head_dim);
    ++k;
    coefficients += r;
    r_min = std::min(r_min, r);
    r_max = std::max(r_max, r);
  }
  const auto fit = std::dynamic_pointer_cast<const LowRankFit>(plan.data);
  return fp16 +
         lowrank_cost(k, coefficients, k > 0 && r_min != r_max, r_max, head_dim, fit ? fit->charge : BasisCharge{});
}

namespace {

struct EffectiveFit {
  std::shared_ptr<const LowRankFit> fit;
  bool by_cached = false;  // coefficient row = cached index (else kept index)
};

// The fit rebuild() and pack() read: the plan's own when it covers every cached token; without
// one (e.g. a plan re-mapped after a chunked prefill) a fit of the kept rows, projected on the
// plan's calibration basis when it has one, so the bytes stay what lowrank_bytes charged.
EffectiveFit effective_fit(const HeadPlan& plan, const ModelGeometry& g, std::span<const std::int32_t> positions,
                           std::span<const float> keys, std::span<const float> values) {
  auto fit = std::dynamic_pointer_cast<const LowRankFit>(plan.data);
  if (fit && fit->n == static_cast<std::int64_t>(plan.codec.size())) return {fit, true};
  const bool shared = fit && fit->charge.shared;
  auto own = fit_lowrank(g, keys, values, positions, shared ? &fit->basis : nullptr);
  if (shared) std::const_pointer_cast<LowRankFit>(own)->charge = fit->charge;
  return {own, false};
}

}  // namespace

void LowRankCodec::reconstruct(const HeadPlan& plan, const ModelGeometry& g, std::span<const std::int32_t> positions,
                               std::span<float> keys, std::span<float> values) const {
  rebuild(plan, g, positions, keys, values, nullptr);
}

int LowRankCodec::reconstruct_factored(const HeadPlan& plan, const ModelGeometry& g,
                                       std::span<const std::int32_t> positions, std::span<float> keys,
                                       std::span<float> values, std::span<const float>& basis) const {
  basis = {};
  return rebuild(plan, g, positions, keys, values, &basis);
}

bool LowRankCodec::reads_rows(const HeadPlan& plan) const {
  // rebuild() fits the kept rows themselves unless the plan's fit covers every cached token, and
  // copies fp16 rows through untouched.
  const auto fit = std::dynamic_pointer_cast<const LowRankFit>(plan.data);
  if (!fit || fit->n != static_cast<std::int64_t>(plan.codec.size())) return true;
  return std::any_of(plan.codec.begin(), plan.codec.end(),
                     [](TokenCodec c) { return c != TokenCodec::Drop && c != TokenCodec::LowRank; });
}

void LowRankCodec::pack(const HeadPlan& plan, const ModelGeometry& g, std::span<const std::int32_t> positions,
                        std::span<const float> keys, std::span<const float> values, PackedEntry& out) const {
  const int d = g.head_dim;
  const auto [fit, by_cached] = effective_fit(plan, g, positions, keys, values);
  out = PackedEntry{};
  out.head_dim = d;
  out.k.rotate = true;
  bool any = false;
  std::size_t row = 0;
  for (std::size_t j = 0; j < plan.codec.size(); ++j) {
    if (plan.codec[j] == TokenCodec::Drop) continue;
    const auto at = row * static_cast<std::size_t>(d);
    if (plan.codec[j] == TokenCodec::LowRank) {
      any = true;
      const int r = std::min<int>(plan.rank.at(j), d);
      const std::size_t src = (by_cached ? j : row) * static_cast<std::size_t>(d);
      for (PackedTensor* t : {&out.k, &out.v}) {
        PackedRow p;
        p.kind = PackedKind::LowRank;
        p.rank = static_cast<std::uint16_t>(r);
        p.position = positions[row];
        p.data = static_cast<std::int64_t>(t->halves.size());
        const std::vector<float>& c = t == &out.k ? fit->ck : fit->cv;
        for (int i = 0; i < r; ++i) t->halves.push_back(float_to_half(c[src + static_cast<std::size_t>(i)]));
        t->rows.push_back(p);
      }
    } else {
      pack_fp16_row(out.k, keys.data() + at, d, positions[row]);
      pack_fp16_row(out.v, values.data() + at, d, positions[row]);
    }
    ++row;
  }
  if (!any) return;
  // A request's own basis stores the directions its ranks use; a calibration basis is whole.
  int cols = d;
  if (!fit->charge.shared) {
    cols = 0;
    for (const PackedRow& r : out.k.rows)
      if (r.kind == PackedKind::LowRank) cols = std::max<int>(cols, r.rank);
    cols = std::max(cols, 1);
  }
  for (PackedTensor* t : {&out.k, &out.v}) {
    const std::vector<float>& u = t == &out.k ? fit->basis.uk : fit->basis.uv;
    t->basis_cols = cols;
    t->basis_charge = fit->charge.shared ? 1.0 / fit->charge.serves : 1.0;
    for (int i = 0; i < d; ++i)
      for (int c = 0; c < cols; ++c) t->basis.push_back(float_to_half(u[static_cast<std::size_t>(i * d + c)]));
  }
}

int LowRankCodec::rebuild(const HeadPlan& plan, const ModelGeometry& g, std::span<const std::int32_t> positions,
                          std::span<float> keys, std::span<float> values, std::span<const float>* basis) const {
  const int d = g.head_dim;
  const auto [fit, by_cached] = effective_fit(plan, g, positions, keys, values);
  const HeadBasis& b = fit->basis;
  const Eigen::Map<const RowMat> uk(b.uk.data(), d, d), uv(b.uv.data(), d, d);
  // Each LowRank row's coefficients beyond its rank are zeroed, then all rows are rebuilt by one
  // GEMM per tensor (ranks differ per token, the basis does not).
  const auto m = static_cast<Eigen::Index>(std::count(plan.codec.begin(), plan.codec.end(), TokenCodec::LowRank));
  // Values stay factored when every kept token is LowRank and the basis outlives this call (it
  // is the plan's own fit): the coefficient matrix is then the values buffer itself.
  const bool factored = basis && by_cached && m == static_cast<Eigen::Index>(positions.size());
  thread_local ScratchMatrix ck_buf, cv_buf, kr_buf, vr_buf;
  // Only the first r_max basis directions take part (no row has coefficients beyond them).
  Eigen::Index r_max = 0;
  for (std::size_t j = 0; j < plan.codec.size(); ++j)
    if (plan.codec[j] == TokenCodec::LowRank)
      r_max = std::max<Eigen::Index>(r_max, std::min<Eigen::Index>(plan.rank.at(j), d));
  auto ck = ck_buf.get(m, r_max);
  auto cv = factored ? Eigen::Map<ScratchMatrix::Mat>(values.data(), m, r_max) : cv_buf.get(m, r_max);
  std::size_t row = 0;
  {
    Eigen::Index i = 0;
    for (std::size_t j = 0; j < plan.codec.size(); ++j) {
      if (plan.codec[j] == TokenCodec::Drop) continue;
      if (plan.codec[j] == TokenCodec::LowRank) {
        const Eigen::Index r = std::min<Eigen::Index>(plan.rank.at(j), d);
        const auto src = static_cast<Eigen::Index>(by_cached ? j : row) * d;
        ck.row(i).head(r) = Eigen::Map<const Eigen::RowVectorXf>(fit->ck.data() + src, r);
        cv.row(i).head(r) = Eigen::Map<const Eigen::RowVectorXf>(fit->cv.data() + src, r);
        ck.row(i).tail(r_max - r).setZero();
        cv.row(i).tail(r_max - r).setZero();
        ++i;
      }
      ++row;
    }
  }
  auto kr = kr_buf.get(m, d);
  kr.noalias() = ck * uk.leftCols(r_max).transpose();
  if (factored) {
    *basis = std::span<const float>(b.uv.data(), b.uv.size());
  } else {
    auto vr = vr_buf.get(m, d);
    vr.noalias() = cv * uv.leftCols(r_max).transpose();
    Eigen::Index i = 0;
    row = 0;
    for (std::size_t j = 0; j < plan.codec.size(); ++j) {
      if (plan.codec[j] == TokenCodec::Drop) continue;
      if (plan.codec[j] == TokenCodec::LowRank)
        Eigen::Map<Eigen::RowVectorXf>(values.data() + row * d, d) = vr.row(i++);
      ++row;
    }
  }
  Eigen::Index i = 0;
  row = 0;
  RopeTable& rope = rope_table(g.rope);
  for (std::size_t j = 0; j < plan.codec.size(); ++j) {
    if (plan.codec[j] == TokenCodec::Drop) continue;
    if (plan.codec[j] == TokenCodec::LowRank) {
      const auto at = static_cast<Eigen::Index>(row) * d;
      Eigen::Map<Eigen::RowVectorXf>(keys.data() + at, d) = kr.row(i++);
      rope.apply(keys.data() + at, 1, positions[row]);
    }
    ++row;
  }
  return factored ? static_cast<int>(r_max) : -1;
}

}  // namespace kvsim
