// Prompt structure as a signal of its own (seed idea; methods.md §10.c's structural windows — our
// reading, interp). Rule: tokens of the pinned segments (system prompt, question by default) are
// always kept; the rest of the budget is shared among the other segment runs (maximal stretches
// of one segment code) in proportion to their length, each keeping its base scorer's top tokens.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "core/error.h"
#include "policies/base_scorer.h"
#include "policies/registry.h"
#include "policies/selection.h"

namespace kvsim {
namespace {

class Structure : public Policy {
 public:
  Structure(std::unique_ptr<Policy> base, std::set<int> pinned) : base_(std::move(base)), pinned_(std::move(pinned)) {}
  double state_bytes_per_token() const override { return base_->state_bytes_per_token(); }
  LayerPlan compress(const LayerSignals& s, const Budget& budget) const override {
    const auto& scores = static_cast<const ScoringPolicy&>(*base_).cached_score(s);
    if (static_cast<int>(scores.size()) != s.geometry().n_kv_heads)
      throw Error("policy structure: the base must score per KV head (gqa=per_query_head is not supported)");
    LayerPlan plan;
    for (int kv = 0; kv < s.geometry().n_kv_heads; ++kv) {
      const auto cached = s.cached(kv);
      const auto n = static_cast<std::int64_t>(cached.size());
      const HeadScores& hs = scores[static_cast<std::size_t>(kv)];
      std::vector<std::uint8_t> keep(static_cast<std::size_t>(n), 0);
      // Pinned tokens first (the most recent of them if they alone exceed the budget).
      std::vector<float> pin_score(static_cast<std::size_t>(n), 0.0f);
      std::vector<std::uint8_t> is_pinned(static_cast<std::size_t>(n), 0);
      std::int64_t n_pinned = 0;
      for (std::int64_t m = 0; m < n; ++m) {
        const int seg = s.segments()[static_cast<std::size_t>(cached[static_cast<std::size_t>(m)])];
        if (pinned_.count(seg) || (!hs.protect.empty() && hs.protect[static_cast<std::size_t>(m)])) {
          is_pinned[static_cast<std::size_t>(m)] = 1;
          ++n_pinned;
        }
      }
      const auto pinned_kept = top_k_mask(pin_score, std::min(n_pinned, budget.tokens), is_pinned);
      std::int64_t used = 0;
      for (std::int64_t m = 0; m < n; ++m)
        if (is_pinned[static_cast<std::size_t>(m)] && pinned_kept[static_cast<std::size_t>(m)]) {
          keep[static_cast<std::size_t>(m)] = 1;
          ++used;
        }
      // Runs of the other segments share the rest by length (largest remainders get the spare).
      std::vector<std::pair<std::int64_t, std::int64_t>> runs;  // [begin, end) over cache entries
      for (std::int64_t m = 0; m < n;) {
        if (is_pinned[static_cast<std::size_t>(m)]) {
          ++m;
          continue;
        }
        const int seg = s.segments()[static_cast<std::size_t>(cached[static_cast<std::size_t>(m)])];
        std::int64_t e = m;
        while (e < n && !is_pinned[static_cast<std::size_t>(e)] &&
               s.segments()[static_cast<std::size_t>(cached[static_cast<std::size_t>(e)])] == seg)
          ++e;
        runs.emplace_back(m, e);
        m = e;
      }
      const std::int64_t rest = std::max<std::int64_t>(0, budget.tokens - used);
      std::int64_t total = 0;
      for (const auto& [b, e] : runs) total += e - b;
      std::vector<std::int64_t> share(runs.size(), 0);
      std::vector<std::pair<double, std::size_t>> remainder;
      std::int64_t given = 0;
      for (std::size_t r = 0; r < runs.size() && total > 0; ++r) {
        const double exact = static_cast<double>(rest) * static_cast<double>(runs[r].second - runs[r].first) /
                             static_cast<double>(total);
        share[r] = std::min<std::int64_t>(static_cast<std::int64_t>(std::floor(exact)), runs[r].second - runs[r].first);
        given += share[r];
        remainder.push_back({exact - std::floor(exact), r});
      }
      std::stable_sort(remainder.begin(), remainder.end(),
                       [](const auto& x, const auto& y) { return x.first > y.first; });
      for (const auto& [frac, r] : remainder) {
        if (given >= std::min(rest, total)) break;
        if (share[r] < runs[r].second - runs[r].first) {
          ++share[r];
          ++given;
        }
      }
      for (std::size_t r = 0; r < runs.size(); ++r) {
        const auto [b, e] = runs[r];
        const std::span<const float> sc(hs.score.data() + b, static_cast<std::size_t>(e - b));
        const auto mask = top_k_mask(sc, share[r]);
        for (std::int64_t m = b; m < e; ++m) keep[static_cast<std::size_t>(m)] = mask[static_cast<std::size_t>(m - b)];
      }
      plan.heads.push_back(plan_from_mask(keep));
    }
    return plan;
  }

 private:
  std::unique_ptr<Policy> base_;
  std::set<int> pinned_;
};

}  // namespace

KVSIM_REGISTER_POLICY(PolicyInfo{
    "structure",
    "[interp] pin the system prompt and question; other segment runs share the rest by length, by base scores",
    "seed idea (prompt structure as a signal); methods.md §10.c structural windows",
    {{"base", "snapkv", "scoring policy ranking tokens inside each run (its parameters follow '/')"},
     {"pin", "system/question", "segments always kept, '/'-separated: system, context, question"}},
    [](const Params& p) {
      return std::make_unique<Structure>(make_base_scorer(p.text("base"), "structure"),
                                         parse_segment_list(p.text("pin"), "structure", "pin"));
    }});

}  // namespace kvsim
