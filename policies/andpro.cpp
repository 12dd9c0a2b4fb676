// AnDPro — Geng et al., "Accurate KV Cache Eviction via Anchor Direction Projection for Efficient
// LLM Inference", NeurIPS 2025 (paper only; methods.md §10.d — the formula is our reading, interp).
// Rule: per head and observation query i, the anchor u_i is the direction of its attention output
// o_i = sum_j a_ij v_j; token j scores sum_i a_ij <v_j, u_i>, its contribution along the output
// the window's queries produce. Keep the window plus the top scorers.
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
    const int d = g.head_dim;
    std::vector<HeadScores> per_q(static_cast<std::size_t>(g.n_q_heads));
    for (int q = 0; q < g.n_q_heads; ++q) {
      const int kv = q / g.group();
      const std::int64_t n = cache_size(s, kv);
      const int w = static_cast<int>(std::min<std::int64_t>(window_, n));
      const MatrixView a = s.window_attention(q, w);  // [w, n]
      const MatrixView v = s.values(kv);              // [n, d]
      std::vector<float> score(static_cast<std::size_t>(n), 0.0f);
      std::vector<double> u(static_cast<std::size_t>(d));
      for (std::int64_t i = 0; i < a.rows; ++i) {
        std::fill(u.begin(), u.end(), 0.0);
        for (std::int64_t j = 0; j < n; ++j)
          for (int x = 0; x < d; ++x) u[static_cast<std::size_t>(x)] += a.at(i, j) * v.at(j, x);
        double norm = 0;
        for (double x : u) norm += x * x;
        norm = std::sqrt(norm);
        if (norm == 0) continue;
        for (std::int64_t j = 0; j < n; ++j) {
          double proj = 0;
          for (int x = 0; x < d; ++x) proj += v.at(j, x) * u[static_cast<std::size_t>(x)];
          double c = a.at(i, j) * proj / norm;
          if (sign_ == Sign::Clamp) c = std::max(c, 0.0);
          if (sign_ == Sign::Abs) c = std::abs(c);
          score[static_cast<std::size_t>(j)] += static_cast<float>(c);
        }
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
    "andpro", "[interp] window queries' attention-weighted projection of each value on their output direction",
    "Geng et al., NeurIPS 2025 (OpenReview Tdl89SZItB); methods.md §10.d",
    {{"window", "32", "observation window: last prompt tokens whose outputs give the anchor directions"},
     {"sign", "signed", "signed | clamp (negatives to 0) | abs"},
     {"gqa", "mean", "GQA aggregation: mean | max | sum | per_query_head"}},
    [](const Params& p) {
      const std::string sign = p.choice("sign", {"signed", "clamp", "abs"});
      return std::make_unique<AnDPro>(static_cast<int>(p.integer("window")),
                                      sign == "signed" ? Sign::Signed : sign == "clamp" ? Sign::Clamp : Sign::Abs,
                                      parse_gqa(p.text("gqa"), "andpro"));
    }});

}  // namespace kvsim
