// ForesightKV's golden eviction — Li et al., "ForesightKV", arXiv 2602.03203 (RUCAIBox/ForesightKV
// supervised_training/train.py), in its one-shot form at the compression point.
// Rule: score each token by the largest block-averaged attention any future block of W
// evaluation queries gives it (mean over the GQA group); keep the top tokens.
#include <algorithm>

#include "core/error.h"
#include "policies/registry.h"
#include "policies/selection.h"

namespace kvsim {
namespace {

class OracleGolden : public ScoringPolicy {
 public:
  explicit OracleGolden(std::int64_t block) : block_(block) {}
  bool reads_future() const override { return true; }
  std::vector<HeadScores> score(const LayerSignals& s) const override {
    const ModelGeometry& g = s.geometry();
    std::vector<HeadScores> out(static_cast<std::size_t>(g.n_kv_heads));
    for (int kv = 0; kv < g.n_kv_heads; ++kv) {
      const std::int64_t n = cache_size(s, kv);
      std::vector<float> best(static_cast<std::size_t>(n), 0.0f);
      const std::int64_t rows = s.future_attention(kv * g.group()).rows;
      for (std::int64_t b0 = 0; b0 < rows; b0 += block_) {
        const std::int64_t b1 = std::min(rows, b0 + block_);
        std::vector<double> mean(static_cast<std::size_t>(n), 0.0);
        for (int r = 0; r < g.group(); ++r) {
          const MatrixView a = s.future_attention(kv * g.group() + r);
          for (std::int64_t i = b0; i < b1; ++i)
            for (std::int64_t j = 0; j < n; ++j) mean[static_cast<std::size_t>(j)] += a.at(i, j);
        }
        const double scale = 1.0 / static_cast<double>((b1 - b0) * g.group());
        for (std::int64_t j = 0; j < n; ++j)
          best[static_cast<std::size_t>(j)] = std::max(best[static_cast<std::size_t>(j)],
                                                       static_cast<float>(mean[static_cast<std::size_t>(j)] * scale));
      }
      out[static_cast<std::size_t>(kv)].score = std::move(best);
    }
    return out;
  }

 private:
  std::int64_t block_;
};

}  // namespace

KVSIM_REGISTER_POLICY(PolicyInfo{
    "oracle_golden",
    "ForesightKV golden eviction label, one-shot: keep by max over future query blocks of block-mean attention",
    "Li et al., ForesightKV, arXiv 2602.03203 (offline only)",
    {{"block", "256", "future queries per block W (ForesightKV: 256)"}},
    [](const Params& p) {
      const std::int64_t b = p.integer("block");
      if (b < 1) throw Error("policy oracle_golden: parameter 'block' must be >= 1");
      return std::make_unique<OracleGolden>(b);
    }});

}  // namespace kvsim
