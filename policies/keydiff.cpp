// KeyDiff — Park et al., "KeyDiff: Key Similarity-Based KV Cache Eviction for Long-Context LLM
// Inference in Resource-Constrained Environments", arXiv 2504.15364 (kvpress keydiff_press.py,
// block_press.py).
// Rule: keep the tokens whose keys are least similar (cosine) to the mean normalised key,
// processing the prompt block by block as the paper does.
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "policies/registry.h"
#include "policies/selection.h"

namespace kvsim {
namespace {

// -cos(k_j, anchor) for the candidate tokens, anchor = mean of their normalised keys.
std::vector<float> distinctiveness(const MatrixView& keys, const std::vector<std::int32_t>& cand) {
  const auto d = static_cast<std::size_t>(keys.cols);
  std::vector<double> anchor(d, 0.0);
  std::vector<double> norms(cand.size());
  for (std::size_t c = 0; c < cand.size(); ++c) {
    const float* k = keys.row(cand[c]);
    double nn = 0;
    for (std::size_t x = 0; x < d; ++x) nn += static_cast<double>(k[x]) * k[x];
    norms[c] = std::sqrt(nn) + 1e-12;
    for (std::size_t x = 0; x < d; ++x) anchor[x] += k[x] / norms[c];
  }
  const double an = std::sqrt(std::inner_product(anchor.begin(), anchor.end(), anchor.begin(), 0.0)) + 1e-12;
  std::vector<float> out(cand.size());
  for (std::size_t c = 0; c < cand.size(); ++c) {
    const float* k = keys.row(cand[c]);
    double dot = 0;
    for (std::size_t x = 0; x < d; ++x) dot += k[x] * anchor[x];
    out[c] = static_cast<float>(-dot / (norms[c] * an));
  }
  return out;
}

class KeyDiff : public Policy {
 public:
  explicit KeyDiff(std::int64_t block) : block_(block) {}
  LayerPlan compress(const LayerSignals& s, const Budget& budget) const override {
    const std::int64_t n = s.n_tokens(), keep = std::min(budget.tokens, n);
    LayerPlan plan;
    for (int h = 0; h < s.geometry().n_kv_heads; ++h) {
      const MatrixView keys = s.keys(h);
      // Kept set so far; each block joins the candidates and the set is cut back to `keep`.
      std::vector<std::int32_t> kept;
      const std::int64_t step = block_ > 0 ? block_ : n;
      std::int64_t next = 0;
      while (next < n) {
        const std::int64_t end = next == 0 && block_ > 0 ? std::min(n, std::max(keep, block_)) : std::min(n, next + step);
        std::vector<std::int32_t> cand = kept;
        for (std::int64_t j = next; j < end; ++j) cand.push_back(static_cast<std::int32_t>(j));
        next = end;
        if (static_cast<std::int64_t>(cand.size()) <= keep) {
          kept = cand;
          continue;
        }
        const auto score = distinctiveness(keys, cand);
        const auto mask = top_k_mask(score, keep);  // candidates are in token order: ties keep the later one
        kept.clear();
        for (std::size_t c = 0; c < cand.size(); ++c)
          if (mask[c]) kept.push_back(cand[c]);
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
    "keydiff", "keep the keys least similar to the mean key direction, block by block (attention-free)",
    "Park et al., arXiv 2504.15364",
    {{"block", "128", "prompt block size (kvpress leaderboard: BlockPress block_size=128); 0 = whole prompt at once"}},
    [](const Params& p) {
      const std::int64_t b = p.integer("block");
      if (b < 0) throw Error("policy keydiff: parameter 'block' must be >= 0");
      return std::make_unique<KeyDiff>(b);
    }});

}  // namespace kvsim
