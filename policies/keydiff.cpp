// KeyDiff — Park et al., "KeyDiff: Key Similarity-Based KV Cache Eviction for Long-Context LLM
// Inference in Resource-Constrained Environments", arXiv 2504.15364 (kvpress keydiff_press.py,
// block_press.py).
// Rule: keep the tokens whose keys are least similar (cosine) to the mean normalised key,
// processing the prompt block by block as the paper does.
#include <Eigen/Dense>
#include <cmath>

#include "core/error.h"
#include "policies/registry.h"
#include "policies/selection.h"

namespace kvsim {
namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Unit-normalised keys of every KV head of the layer, shared by all budgets of this policy.
std::vector<RowMat> normalised_keys(const LayerSignals& s) {
  std::vector<RowMat> out;
  for (int h = 0; h < s.geometry().n_kv_heads; ++h) {
    const MatrixView k = s.keys(h);
    RowMat m = Eigen::Map<const RowMat>(k.data, k.rows, k.cols);
    for (Eigen::Index j = 0; j < m.rows(); ++j) m.row(j) /= std::max(m.row(j).norm(), 1e-12f);
    out.push_back(std::move(m));
  }
  return out;
}

class KeyDiff : public Policy {
 public:
  explicit KeyDiff(std::int64_t block) : block_(block) {}
  LayerPlan compress(const LayerSignals& s, const Budget& budget) const override {
    const auto memo = s.memo(this, [&] { return std::make_shared<const std::vector<RowMat>>(normalised_keys(s)); });
    const auto& unit = *static_cast<const std::vector<RowMat>*>(memo.get());
    LayerPlan plan;
    for (int h = 0; h < s.geometry().n_kv_heads; ++h) {
      const RowMat& kh = unit[static_cast<std::size_t>(h)];
      const std::int64_t n = kh.rows(), keep = std::min(budget.tokens, n);  // entries of this head's cache
      // Kept set so far, and the sum of its unit keys; each block joins the candidates, the
      // anchor is their mean unit key, and the set is cut back to `keep` by -cos(k, anchor)
      // (ranked by -k_unit . anchor: the anchor's norm does not change the order).
      std::vector<std::int32_t> kept;
      Eigen::VectorXf kept_sum = Eigen::VectorXf::Zero(kh.cols());
      const std::int64_t step = block_ > 0 ? block_ : n;
      std::int64_t next = 0;
      while (next < n) {
        // The first `keep` tokens fill the cache, then blocks of `block` join it (kvpress BlockPress).
        const std::int64_t end =
            next == 0 && block_ > 0 ? std::min(n, std::max<std::int64_t>(keep, 1)) : std::min(n, next + step);
        std::vector<std::int32_t> cand = kept;
        Eigen::VectorXf anchor = kept_sum;
        for (std::int64_t j = next; j < end; ++j) {
          cand.push_back(static_cast<std::int32_t>(j));
          anchor += kh.row(j).transpose();
        }
        next = end;
        if (static_cast<std::int64_t>(cand.size()) <= keep) {
          kept = std::move(cand);
          kept_sum = anchor;
          continue;
        }
        std::vector<float> score(cand.size());
        for (std::size_t c = 0; c < cand.size(); ++c) score[c] = -kh.row(cand[c]).dot(anchor);
        const auto mask = top_k_mask(score, keep);  // candidates are in token order: ties keep the later one
        kept.clear();
        kept_sum.setZero();
        for (std::size_t c = 0; c < cand.size(); ++c) {
          if (!mask[c]) continue;
          kept.push_back(cand[c]);
          kept_sum += kh.row(cand[c]).transpose();
        }
      }
      std::vector<std::uint8_t> m(static_cast<std::size_t>(n), 0);
      for (auto j : kept) m[static_cast<std::size_t>(j)] = 1;
      plan.heads.push_back(plan_from_mask(m));
    }
    return plan;
  }

 private:
  std::int64_t block_;
};

}  // namespace

KVSIM_REGISTER_POLICY(PolicyInfo{
    "keydiff",
    "keep the keys least similar to the mean key direction, block by block (attention-free)",
    "Park et al., arXiv 2504.15364",
    {{"block", "128", "prompt block size (kvpress leaderboard: BlockPress block_size=128); 0 = whole prompt at once"}},
    [](const Params& p) {
      const std::int64_t b = p.integer("block");
      if (b < 0) throw Error("policy keydiff: parameter 'block' must be >= 0");
      return std::make_unique<KeyDiff>(b);
    }});

}  // namespace kvsim
