// AnDPro — Geng et al., "Accurate KV Cache Eviction via Anchor Direction Projection for Efficient
// LLM Inference", NeurIPS 2025 (paper only; methods.md §10.d — the formula is our reading, interp).
// Rule: per head and observation query i, the anchor u_i is the direction of its attention output
// o_i = sum_j a_ij v_j; token j scores sum_i a_ij <v_j, u_i>, its contribution along the output
// the window's queries produce. Keep the window plus the top scorers.
#include <Eigen/Dense>
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "policies/registry.h"
#include "policies/selection.h"

namespace kvsim {
namespace {

enum class Sign { Signed, Clamp, Abs };

class AnDPro : public ScoringPolicy {
 public:
  AnDPro(int window, Sign sign, GqaAgg gqa) : window_(window), sign_(sign), gqa_(gqa) {}
  std::vector<HeadScores> score(const LayerSignals& s) const override {
    const ModelGeometry& g = s.geometry();
    std::vector<HeadScores> per_q(static_cast<std::size_t>(g.n_q_heads));
    for (int q = 0; q < g.n_q_heads; ++q) {
      const int kv = q / g.group();
      const std::int64_t n = cache_size(s, kv);
      const int w = static_cast<int>(std::min<std::int64_t>(window_, n));
      const MatrixView a = s.window_attention(q, w);  // [w, n]
      const MatrixView v = s.values(kv);              // [n, d]
      using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
      const Eigen::Map<const RowMat> A(a.data, a.rows, a.cols), V(v.data, v.rows, v.cols);
      // Anchors u_i = o_i / |o_i| (rows of A V), and every token's projection on each: P = V U^T.
      Eigen::MatrixXd U = A.cast<double>() * V.cast<double>();
      for (Eigen::Index i = 0; i < U.rows(); ++i) {
        const double norm = U.row(i).norm();
        if (norm == 0)
          U.row(i).setZero();
        else
          U.row(i) /= norm;
      }
      const Eigen::MatrixXd P = V.cast<double>() * U.transpose();  // [n, w]
      std::vector<float> score(static_cast<std::size_t>(n), 0.0f);
      for (std::int64_t j = 0; j < n; ++j) {
        float total = 0;  // float sums in window order, as the rule's reference loop
        for (std::int64_t i = 0; i < a.rows; ++i) {
          double c = static_cast<double>(a.at(i, j)) * P(j, i);
          if (sign_ == Sign::Clamp) c = std::max(c, 0.0);
          if (sign_ == Sign::Abs) c = std::abs(c);
          total += static_cast<float>(c);
        }
        score[static_cast<std::size_t>(j)] = total;
      }
      per_q[static_cast<std::size_t>(q)].score = std::move(score);
      per_q[static_cast<std::size_t>(q)].protect = protect_ends(n, 0, w);
    }
    return group_scores(std::move(per_q), g.group(), gqa_);
  }

 private:
  int window_;
  Sign sign_;
  GqaAgg gqa_;
};

}  // namespace

KVSIM_REGISTER_POLICY(PolicyInfo{
    "andpro",
    "[interp] window queries' attention-weighted projection of each value on their output direction",
    "Geng et al., NeurIPS 2025 (OpenReview Tdl89SZItB); methods.md §10.d",
    {{"window", "32", "observation window: last prompt tokens whose outputs give the anchor directions"},
     {"sign", "signed", "signed | clamp (negatives to 0) | abs"},
     {"gqa", "mean", "GQA aggregation: mean | max | sum | per_query_head"}},
    [](const Params& p) {
      const std::string sign = p.choice("sign", {"signed", "clamp", "abs"});
      return std::make_unique<AnDPro>(static_cast<int>(p.integer("window")),
                                      sign == "signed"  ? Sign::Signed
                                      : sign == "clamp" ? Sign::Clamp
                                                        : Sign::Abs,
                                      parse_gqa(p.text("gqa"), "andpro"));
    }});

}  // namespace kvsim
