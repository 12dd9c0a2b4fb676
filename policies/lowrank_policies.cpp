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
#include <numeric>

#include "core/error.h"
#include "policies/basis_set.h"
#include "policies/lowrank.h"
#include "policies/quantized_tier.h"
#include "policies/registry.h"
#include "policies/selection.h"

namespace kvsim {
namespace {

// Keeps as many tokens as fit at rank `min_rank` (sinks + recent when not all do: the plan is
// marked as a fallback by position), as LowRank; `ranks_differ` says whether the plan will pay
// per-token rank bytes.
HeadPlan fit_tokens(std::int64_t n, double budget, int sinks, int min_rank, bool ranks_differ, int d,
                    const BasisCharge& charge) {
  HeadPlan p = fit_quantized(n, budget, sinks, TokenCodec::LowRank, [&](std::int64_t k) {
    return lowrank_cost(k, static_cast<double>(k) * min_rank, ranks_differ, min_rank, d, charge);
  });
  p.rank.assign(static_cast<std::size_t>(n), 0);
  for (std::size_t j = 0; j < p.codec.size(); ++j)
    if (p.codec[j] != TokenCodec::Drop) p.rank[j] = static_cast<std::uint16_t>(min_rank);
  return p;
}

// basis=request fits on the request's own cached tokens; anything else is a basis file, whose
// bytes are amortised over `serves` requests.
std::shared_ptr<const BasisSet> basis_param(const Params& p, const char* policy) {
  const double serves = p.number("serves");
  if (!(serves >= 1))
    throw Error(std::string("policy ") + policy + ": parameter 'serves' = " + p.text("serves") +
                ", expected a number >= 1");
  const std::string value = p.text("basis");
  if (value == "request") return nullptr;
  auto set = std::make_shared<BasisSet>(load_basis_set(value));
  set->serves = serves;
  return set;
}

BasisCharge charge_of(const BasisSet* calibration) {
  return calibration ? BasisCharge{true, calibration->serves} : BasisCharge{};
}

// Greedy water-filling: `spare` times, the kept token whose next coefficient has the largest gain
// gets one more rank, up to `cap` (ties: the larger token index; a token's coefficients in order).
// Computed without the heap: the greedy takes a coefficient exactly when its running minimum over
// the token's earlier coefficients clears the threshold (a dip holds back what follows it), so
// the result is the `spare` largest running minima, ties in the greedy's order. Same plan, one
// selection pass instead of a heap pop per coefficient.
struct Floors {
  std::vector<std::size_t> tokens;  // kept tokens with room to grow
  std::vector<std::size_t> offset;  // token t's coefficient rank[t] + m sits at offset[t] + m
  std::vector<double> floor_gain, gain;
};

template <class Gain>
void running_minima(const HeadPlan& p, const Gain& gain, int cap, Floors& f) {
  f.tokens.clear();
  for (std::size_t j = 0; j < p.codec.size(); ++j)
    if (p.codec[j] != TokenCodec::Drop && p.rank[j] < cap) f.tokens.push_back(j);
  f.offset.assign(f.tokens.size() + 1, 0);
  for (std::size_t t = 0; t < f.tokens.size(); ++t)
    f.offset[t + 1] = f.offset[t] + static_cast<std::size_t>(cap - p.rank[f.tokens[t]]);
  f.floor_gain.resize(f.offset.back());
  f.gain.resize(f.offset.back());
  for (std::size_t t = 0; t < f.tokens.size(); ++t) {
    double m = std::numeric_limits<double>::infinity();
    for (int r = p.rank[f.tokens[t]]; r < cap; ++r) {
      const auto at = f.offset[t] + static_cast<std::size_t>(r - p.rank[f.tokens[t]]);
      f.gain[at] = gain(f.tokens[t], r);
      f.floor_gain[at] = m = std::min(m, f.gain[at]);
    }
  }
}

// Coefficients of token t (an index into f.tokens) below `cap`, from its rank when f was made.
std::size_t below_cap(const Floors& f, std::size_t t, int cap, int d) {
  const std::size_t len = f.offset[t + 1] - f.offset[t];  // d - rank
  const auto cut = static_cast<std::size_t>(d - cap);
  return len > cut ? len - cut : 0;
}

// `f` holds the plan's running minima up to head_dim d (running_minima(p, gain, d, f)).
void water_fill(HeadPlan& p, std::int64_t spare, const Floors& f, int cap, int d) {
  if (spare <= 0 || f.tokens.empty()) return;
  thread_local std::vector<double> sorted;  // megabytes per head, every config and layer
  sorted.clear();
  for (std::size_t t = 0; t < f.tokens.size(); ++t)
    sorted.insert(sorted.end(), f.floor_gain.begin() + static_cast<std::ptrdiff_t>(f.offset[t]),
                  f.floor_gain.begin() + static_cast<std::ptrdiff_t>(f.offset[t] + below_cap(f, t, cap, d)));
  if (static_cast<std::size_t>(spare) >= sorted.size()) {
    for (std::size_t t = 0; t < f.tokens.size(); ++t)
      p.rank[f.tokens[t]] = static_cast<std::uint16_t>(p.rank[f.tokens[t]] + below_cap(f, t, cap, d));
    return;
  }
  const auto nth = sorted.begin() + (spare - 1);
  std::nth_element(sorted.begin(), nth, sorted.end(), std::greater<>());
  const double theta = *nth;
  // Everything above the threshold; then the threshold's ties, larger token index first.
  std::int64_t left = spare;
  std::vector<int> at_theta(f.tokens.size(), 0);
  for (std::size_t t = 0; t < f.tokens.size(); ++t) {
    const std::size_t end = f.offset[t] + below_cap(f, t, cap, d);
    int above = 0;
    for (std::size_t k = f.offset[t]; k < end && f.floor_gain[k] > theta; ++k) ++above;
    for (std::size_t k = f.offset[t] + static_cast<std::size_t>(above); k < end && f.floor_gain[k] == theta; ++k)
      ++at_theta[t];
    p.rank[f.tokens[t]] = static_cast<std::uint16_t>(p.rank[f.tokens[t]] + above);
    left -= above;
  }
  for (std::size_t t = f.tokens.size(); t-- > 0 && left > 0;) {
    const auto take = std::min<std::int64_t>(left, at_theta[t]);
    p.rank[f.tokens[t]] = static_cast<std::uint16_t>(p.rank[f.tokens[t]] + take);
    left -= take;
  }
}

// The highest rank R the water-filling may give (a request's own basis stores R directions, so
// a higher cap buys reach at the cost of coefficients): the cap whose fill captures the most
// gain. Caps are visited in increasing order, their coefficients joining a Fenwick tree over the
// greedy's order (floor gain descending, larger token first, then rank), so each cap's fill, the
// `spare(R)` first entries present, is one descent: O(n d log(n d)) for every cap together.
// Each coefficient's position in the greedy's order (best_cap's Fenwick slots).
std::vector<std::size_t> greedy_slots(const Floors& f) {
  const std::size_t m = f.floor_gain.size();
  // Sorted as values, not as indices into the arrays: the comparisons stay in cache.
  struct Entry {
    double floor_gain;
    std::size_t token, k;
  };
  std::vector<Entry> order(m);
  for (std::size_t t = 0; t < f.tokens.size(); ++t)
    for (std::size_t k = f.offset[t]; k < f.offset[t + 1]; ++k) order[k] = {f.floor_gain[k], t, k};
  std::sort(order.begin(), order.end(), [](const Entry& a, const Entry& b) {
    if (a.floor_gain != b.floor_gain) return a.floor_gain > b.floor_gain;
    if (a.token != b.token) return a.token > b.token;
    return a.k < b.k;
  });
  std::vector<std::size_t> slot(m);
  for (std::size_t i = 0; i < m; ++i) slot[order[i].k] = i;
  return slot;
}

int best_cap(const HeadPlan& p, const Floors& f, const std::vector<std::size_t>& slot, int r_min, int d,
             const std::function<std::int64_t(int)>& spare) {
  const std::size_t m = f.floor_gain.size();
  if (m == 0) return r_min;
  std::vector<std::int64_t> count(m + 1, 0);
  std::vector<double> sum(m + 1, 0.0);
  auto insert = [&](std::size_t k) {
    for (std::size_t i = slot[k] + 1; i <= m; i += i & (~i + 1)) {
      ++count[i];
      sum[i] += f.gain[k];
    }
  };
  int top = 1;
  while (top * 2 <= static_cast<int>(m)) top *= 2;
  int best = r_min;
  double best_gain = -1;
  for (int cap = r_min + 1; cap <= d; ++cap) {
    for (std::size_t t = 0; t < f.tokens.size(); ++t) {  // coefficient cap - 1 of every token joins
      const int first = p.rank[f.tokens[t]];
      if (cap - 1 >= first) insert(f.offset[t] + static_cast<std::size_t>(cap - 1 - first));
    }
    std::int64_t want = spare(cap);
    if (want < 0) break;  // the bases alone no longer fit: higher caps cost more
    double got = 0;
    std::size_t at = 0;
    for (int step = top; step > 0; step /= 2) {  // the longest prefix holding at most `want` entries
      const std::size_t next = at + static_cast<std::size_t>(step);
      if (next <= m && count[next] <= want) {
        at = next;
        want -= count[next];
        got += sum[next];
      }
    }
    if (got > best_gain) best_gain = got, best = cap;
  }
  return best;
}

class LowRankUniform : public Policy {
 public:
  LowRankUniform(int sinks, std::shared_ptr<const BasisSet> basis) : sinks_(sinks), basis_(std::move(basis)) {}
  const KvCodec* codec() const override { return &codec_; }
  LayerPlan compress(const LayerSignals& s, const Budget& budget) const override {
    const int d = s.geometry().head_dim;
    const auto fits = layer_fits(s, basis_);
    const BasisCharge charge = charge_of(basis_.get());
    LayerPlan plan;
    for (int kv = 0; kv < s.geometry().n_kv_heads; ++kv) {
      const auto n = static_cast<std::int64_t>(s.cached(kv).size());
      const double B = head_byte_budget(s, budget);
      // The largest uniform rank whose cost fits with every token kept (1 when none does: then
      // fit_tokens keeps what fits at rank 1, by position). One rank for all: no rank bytes.
      int r = d;
      while (r > 1 && lowrank_cost(n, static_cast<double>(n) * r, false, r, d, charge) > B) --r;
      plan.heads.push_back(fit_tokens(n, B, sinks_, r, false, d, charge));
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
    const int d = g.head_dim, r_min = std::min(r_min_, d);
    const auto fits = layer_fits(s, basis_);
    const BasisCharge charge = charge_of(basis_.get());
    LayerPlan plan;
    for (int kv = 0; kv < g.n_kv_heads; ++kv) {
      const auto n = static_cast<std::int64_t>(s.cached(kv).size());
      const double B = head_byte_budget(s, budget);
      HeadPlan p = fit_tokens(n, B, sinks_, r_min, true, d, charge);
      // Water-filling over the coefficients left once every kept token has r_min, up to the cap
      // whose bases leave the most useful coefficients.
      const std::int64_t kept = p.kept();
      auto spare = [&](int cap) {
        const double left = B - lowrank_cost(kept, static_cast<double>(kept) * r_min, true, cap, d, charge);
        return left < 0 ? std::int64_t{-1} : static_cast<std::int64_t>(std::floor(left / 4.0));
      };
      const Greedy* greedy = nullptr;
      thread_local Greedy local;  // megabytes per head, every config and layer
      if (kept == n) {            // every token at r_min: the same greedy at every budget where all fit
        greedy = &all_kept(s, fits, r_min)[static_cast<std::size_t>(kv)];
      } else {
        prepare(s, kv, fits, p, local);
        greedy = &local;
      }
      const int cap = best_cap(p, greedy->floors, greedy->slot, r_min, d, spare);
      water_fill(p, spare(cap), greedy->floors, cap, d);
      p.data = fits[static_cast<std::size_t>(kv)];
      plan.heads.push_back(std::move(p));
    }
    return plan;
  }

 private:
  struct Greedy {
    Floors floors;
    std::vector<std::size_t> slot;
  };
  // The greedy's running minima and order for plan p of head kv.
  void prepare(const LayerSignals& s, int kv, const std::vector<std::shared_ptr<const LowRankFit>>& fits,
               const HeadPlan& p, Greedy& out) const {
    const int d = s.geometry().head_dim;
    const std::vector<double> sal = salience(s, kv, static_cast<std::int64_t>(s.cached(kv).size()));
    // Energies of each token's coefficients (K and V together) in the bases.
    const LowRankFit& fit = *fits[static_cast<std::size_t>(kv)];
    const std::vector<float>&ck = fit.ck, &cv = fit.cv;
    auto gain = [&](std::size_t j, int r) {
      const std::size_t at = j * static_cast<std::size_t>(d) + static_cast<std::size_t>(r);
      return sal[j] * (static_cast<double>(ck[at]) * ck[at] + static_cast<double>(cv[at]) * cv[at]);
    };
    running_minima(p, gain, d, out.floors);
    out.slot = greedy_slots(out.floors);
  }
  // Every head's greedy when every token is kept at r_min, once per layer's signals.
  const std::vector<Greedy>& all_kept(const LayerSignals& s, const std::vector<std::shared_ptr<const LowRankFit>>& fits,
                                      int r_min) const {
    const auto memo = s.memo(this, [&] {
      auto heads = std::make_shared<std::vector<Greedy>>(static_cast<std::size_t>(s.geometry().n_kv_heads));
      for (int kv = 0; kv < s.geometry().n_kv_heads; ++kv) {
        const auto n = static_cast<std::int64_t>(s.cached(kv).size());
        HeadPlan p = fit_tokens(n, std::numeric_limits<double>::infinity(), sinks_, r_min, true, s.geometry().head_dim,
                                charge_of(basis_.get()));
        prepare(s, kv, fits, p, (*heads)[static_cast<std::size_t>(kv)]);
      }
      return std::shared_ptr<const void>(std::move(heads));
    });
    return *static_cast<const std::vector<Greedy>*>(memo.get());
  }
  // Window attention summed over the group's query heads, normalised to sum 1.
  std::vector<double> salience(const LayerSignals& s, int kv, std::int64_t n) const {
    const ModelGeometry& g = s.geometry();
    const int w = static_cast<int>(std::min<std::int64_t>(window_, n));
    std::vector<double> sal(static_cast<std::size_t>(n), 0.0);
    for (int r = 0; r < g.group(); ++r) {
      const auto cols = column_sums(s.window_attention(kv * g.group() + r, w));
      for (std::size_t j = 0; j < cols.size(); ++j) sal[j] += cols[j];
    }
    double total = 0;
    for (double x : sal) total += x;
    for (double& x : sal) x = total > 0 ? x / total : 1.0 / static_cast<double>(n);
    return sal;
  }

  LowRankCodec codec_;
  int r_min_, window_, sinks_;
  std::shared_ptr<const BasisSet> basis_;
};

}  // namespace

KVSIM_REGISTER_POLICY(PolicyInfo{
    "lowrank",
    "every token at the same rank r in per-head PCA bases of pre-RoPE keys and of values (the request's own)",
    "uniform low-rank baseline, methods.md §11 (Palu / xKV style, training-free basis)",
    {{"sinks", "4", "first tokens kept when not every token fits at rank 1"},
     {"basis", "request",
      "request: fitted on the request's own cached tokens | FILE: calibration bases (kvsim trace fit-basis)"},
     {"serves", "100", "requests a calibration basis's bytes are amortised over (basis=FILE)"}},
    [](const Params& p) {
      return std::make_unique<LowRankUniform>(static_cast<int>(p.integer("sinks")), basis_param(p, "lowrank"));
    }});

// The issue and the seed papers call the uniform baseline lowrank_uniform.
KVSIM_REGISTER_POLICY_ALIAS("lowrank_uniform", "lowrank");

KVSIM_REGISTER_POLICY(PolicyInfo{
    "varrate",
    "[interp] variable rank per token >= r_min: greedy water-filling on salience-weighted coefficient energy",
    "seed VarRate (not found), read after DynaKV arXiv 2603.04411; methods.md §10.b",
    {{"r_min", "1", "rank every kept token keeps at least"},
     {"window", "32", "observation window whose attention gives the salience (SnapKV's)"},
     {"sinks", "4", "first tokens kept when not every token fits at r_min"},
     {"basis", "request",
      "request: fitted on the request's own cached tokens | FILE: calibration bases (kvsim trace fit-basis)"},
     {"serves", "100", "requests a calibration basis's bytes are amortised over (basis=FILE)"}},
    [](const Params& p) {
      if (p.integer("r_min") < 1) throw Error("varrate: r_min must be >= 1");
      return std::make_unique<VarRate>(static_cast<int>(p.integer("r_min")), static_cast<int>(p.integer("window")),
                                       static_cast<int>(p.integer("sinks")), basis_param(p, "varrate"));
    }});

}  // namespace kvsim
