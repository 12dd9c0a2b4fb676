// Low-rank storage policies at matched bytes (methods.md §10.b, §11; `varrate` is our reading of
// the seed's VarRate, after DynaKV arXiv 2603.04411 — marked interp).
// lowrank: every token keeps the same rank r, the largest whose bytes fit the budget.
// varrate: every token keeps rank >= r_min; the remaining coefficient budget goes, one dimension at
// a time, to the token whose next coefficient removes the most salience-weighted energy
// (salience: SnapKV-style window attention, summed over the group), greedy water-filling.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "core/error.h"
#include "policies/basis_set.h"
#include "policies/lowrank.h"
#include "policies/quantized_tier.h"
#include "policies/registry.h"
#include "policies/selection.h"

namespace kvsim {
namespace {

// Cost of k tokens at an average of `r` coefficients: 4 bytes per coefficient (K and V, fp16),
// one rank byte per token, and the two fp16 bases.
double lowrank_cost(std::int64_t k, double r, int d) { return static_cast<double>(k) * (4.0 * r + 1.0) + 4.0 * d * d; }

// Keeps as many tokens as fit at rank `min_rank` (sinks + recent when not all do), as LowRank.
HeadPlan fit_tokens(std::int64_t n, double budget, int sinks, int min_rank, int d) {
  HeadPlan p = fit_quantized(n, budget, sinks, TokenCodec::LowRank,
                             [&](std::int64_t k) { return lowrank_cost(k, min_rank, d); });
  p.rank.assign(static_cast<std::size_t>(n), 0);
  for (std::size_t j = 0; j < p.codec.size(); ++j)
    if (p.codec[j] != TokenCodec::Drop) p.rank[j] = static_cast<std::uint16_t>(min_rank);
  return p;
}

// basis=request fits on the request's own cached tokens; anything else is a basis file.
std::shared_ptr<const BasisSet> basis_param(const std::string& value) {
  if (value == "request") return nullptr;
  return std::make_shared<const BasisSet>(load_basis_set(value));
}

// Greedy water-filling: `spare` times, the kept token whose next coefficient has the largest gain
// gets one more rank (ties: the larger token index; a token's coefficients in order). Computed
// without the heap: the greedy takes a coefficient exactly when its running minimum over the
// token's earlier coefficients clears the threshold (a dip holds back what follows it), so the
// result is the `spare` largest running minima, ties in the greedy's order. Same plan, one
// selection pass instead of a heap pop per coefficient.
template <class Gain>
void water_fill(HeadPlan& p, std::int64_t spare, const Gain& gain, int d) {
  std::vector<std::size_t> tokens;
  for (std::size_t j = 0; j < p.codec.size(); ++j)
    if (p.codec[j] != TokenCodec::Drop && p.rank[j] < d) tokens.push_back(j);
  if (spare <= 0 || tokens.empty()) return;
  // Running minima, token-major: token tokens[t]'s coefficient r_min + m sits at offset[t] + m.
  // Per-thread buffers: megabytes per head, every config and layer.
  thread_local std::vector<std::size_t> offset;
  thread_local std::vector<double> floor_gain, sorted;
  offset.assign(tokens.size() + 1, 0);
  for (std::size_t t = 0; t < tokens.size(); ++t) offset[t + 1] = offset[t] + static_cast<std::size_t>(d - p.rank[tokens[t]]);
  floor_gain.resize(offset.back());
  for (std::size_t t = 0; t < tokens.size(); ++t) {
    double m = std::numeric_limits<double>::infinity();
    for (int r = p.rank[tokens[t]]; r < d; ++r) {
      m = std::min(m, gain(tokens[t], r));
      floor_gain[offset[t] + static_cast<std::size_t>(r - p.rank[tokens[t]])] = m;
    }
  }
  if (static_cast<std::size_t>(spare) >= floor_gain.size()) {
    for (std::size_t j : tokens) p.rank[j] = static_cast<std::uint16_t>(d);
    return;
  }
  sorted.assign(floor_gain.begin(), floor_gain.end());
  const auto nth = sorted.begin() + (spare - 1);
  std::nth_element(sorted.begin(), nth, sorted.end(), std::greater<>());
  const double theta = *nth;
  // Everything above the threshold; then the threshold's ties, larger token index first.
  std::int64_t left = spare;
  std::vector<int> at_theta(tokens.size(), 0);
  for (std::size_t t = 0; t < tokens.size(); ++t) {
    int above = 0;
    for (std::size_t k = offset[t]; k < offset[t + 1] && floor_gain[k] > theta; ++k) ++above;
    for (std::size_t k = offset[t] + static_cast<std::size_t>(above); k < offset[t + 1] && floor_gain[k] == theta; ++k)
      ++at_theta[t];
    p.rank[tokens[t]] = static_cast<std::uint16_t>(p.rank[tokens[t]] + above);
    left -= above;
  }
  for (std::size_t t = tokens.size(); t-- > 0 && left > 0;) {
    const auto take = std::min<std::int64_t>(left, at_theta[t]);
    p.rank[tokens[t]] = static_cast<std::uint16_t>(p.rank[tokens[t]] + take);
    left -= take;
  }
}

class LowRankUniform : public Policy {
 public:
  LowRankUniform(int sinks, std::shared_ptr<const BasisSet> basis) : sinks_(sinks), basis_(std::move(basis)) {}
  const KvCodec* codec() const override { return &codec_; }
  LayerPlan compress(const LayerSignals& s, const Budget& budget) const override {
    const int d = s.geometry().head_dim;
    const auto fits = layer_fits(s, basis_.get());
    LayerPlan plan;
    for (int kv = 0; kv < s.geometry().n_kv_heads; ++kv) {
      const auto n = static_cast<std::int64_t>(s.cached(kv).size());
      const double B = head_byte_budget(s, budget);
      // The largest uniform rank whose cost fits with every token kept (at least 1).
      const auto r = static_cast<int>(std::clamp<double>(std::floor((B - 4.0 * d * d - static_cast<double>(n)) /
                                                                    (4.0 * static_cast<double>(std::max<std::int64_t>(n, 1)))),
                                                         1.0, d));
      plan.heads.push_back(fit_tokens(n, B, sinks_, r, d));
      plan.heads.back().data = fits[static_cast<std::size_t>(kv)];
    }
    return plan;
  }

 private:
  LowRankCodec codec_;
  int sinks_;
  std::shared_ptr<const BasisSet> basis_;
};

class VarRate : public Policy {
 public:
  VarRate(int r_min, int window, int sinks, std::shared_ptr<const BasisSet> basis)
      : r_min_(r_min), window_(window), sinks_(sinks), basis_(std::move(basis)) {}
  const KvCodec* codec() const override { return &codec_; }
  LayerPlan compress(const LayerSignals& s, const Budget& budget) const override {
    const ModelGeometry& g = s.geometry();
    const int d = g.head_dim;
    const auto fits = layer_fits(s, basis_.get());
    LayerPlan plan;
    for (int kv = 0; kv < g.n_kv_heads; ++kv) {
      const auto n = static_cast<std::int64_t>(s.cached(kv).size());
      const double B = head_byte_budget(s, budget);
      HeadPlan p = fit_tokens(n, B, sinks_, r_min_, d);
      // Salience: window attention summed over the group's query heads, normalised to sum 1.
      const int w = static_cast<int>(std::min<std::int64_t>(window_, n));
      std::vector<double> sal(static_cast<std::size_t>(n), 0.0);
      for (int r = 0; r < g.group(); ++r) {
        const auto cols = column_sums(s.window_attention(kv * g.group() + r, w));
        for (std::size_t j = 0; j < cols.size(); ++j) sal[j] += cols[j];
      }
      double total = 0;
      for (double x : sal) total += x;
      for (double& x : sal) x = total > 0 ? x / total : 1.0 / static_cast<double>(n);
      // Energies of each token's coefficients (K and V together) in the bases.
      const LowRankFit& fit = *fits[static_cast<std::size_t>(kv)];
      const std::vector<float>&ck = fit.ck, &cv = fit.cv;
      auto gain = [&](std::size_t j, int r) {
        const std::size_t at = j * static_cast<std::size_t>(d) + static_cast<std::size_t>(r);
        return sal[j] * (static_cast<double>(ck[at]) * ck[at] + static_cast<double>(cv[at]) * cv[at]);
      };
      // Water-filling over the coefficients left once every kept token has r_min.
      std::int64_t kept = p.kept();
      auto spare = static_cast<std::int64_t>(std::floor((B - lowrank_cost(kept, r_min_, d)) / 4.0));
      water_fill(p, spare, gain, d);
      p.data = fits[static_cast<std::size_t>(kv)];
      plan.heads.push_back(std::move(p));
    }
    return plan;
  }

 private:
  LowRankCodec codec_;
  int r_min_, window_, sinks_;
  std::shared_ptr<const BasisSet> basis_;
};

}  // namespace

KVSIM_REGISTER_POLICY(PolicyInfo{
    "lowrank", "every token at the same rank r in per-head PCA bases of pre-RoPE keys and of values (the request's own)",
    "uniform low-rank baseline, methods.md §11 (Palu / xKV style, training-free basis)",
    {{"sinks", "4", "first tokens kept when not every token fits at rank 1"},
     {"basis", "request", "request: fitted on the request's own cached tokens | FILE: calibration bases (kvsim trace fit-basis)"}},
    [](const Params& p) {
      return std::make_unique<LowRankUniform>(static_cast<int>(p.integer("sinks")), basis_param(p.text("basis")));
    }});

// The issue and the seed papers call the uniform baseline lowrank_uniform.
KVSIM_REGISTER_POLICY_ALIAS("lowrank_uniform", "lowrank");

KVSIM_REGISTER_POLICY(PolicyInfo{
    "varrate", "[interp] variable rank per token >= r_min: greedy water-filling on salience-weighted coefficient energy",
    "seed VarRate (not found), read after DynaKV arXiv 2603.04411; methods.md §10.b",
    {{"r_min", "1", "rank every kept token keeps at least"},
     {"window", "32", "observation window whose attention gives the salience (SnapKV's)"},
     {"sinks", "4", "first tokens kept when not every token fits at r_min"},
     {"basis", "request", "request: fitted on the request's own cached tokens | FILE: calibration bases (kvsim trace fit-basis)"}},
    [](const Params& p) {
      if (p.integer("r_min") < 1) throw Error("varrate: r_min must be >= 1");
      return std::make_unique<VarRate>(static_cast<int>(p.integer("r_min")), static_cast<int>(p.integer("window")),
                                       static_cast<int>(p.integer("sinks")), basis_param(p.text("basis")));
    }});

}  // namespace kvsim
