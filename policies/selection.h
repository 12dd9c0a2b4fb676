#pragma once
// Building blocks shared by scoring policies: top-k with the documented tie rule, 1-D pooling,
// GQA aggregation, and the default "each head keeps its top-B" selection.
#include <cstdint>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "policies/policy.h"

namespace kvsim {

// Token scores of one KV head (higher = keep) and the tokens that must stay regardless
// (windows, sinks). Protected tokens count inside the budget.
struct HeadScores {
  std::vector<float> score;           // [n]
  std::vector<std::uint8_t> protect;  // [n], 1 = always kept (empty = none)
};

// Keep-mask of the k best tokens: protected ones first (the most recent ones if there are more
// than k), then by decreasing score. Ties keep the more recent token (higher index), so results
// never depend on sort stability.
std::vector<std::uint8_t> top_k_mask(std::span<const float> score, std::int64_t k,
                                     std::span<const std::uint8_t> protect = {});

HeadPlan plan_from_mask(std::span<const std::uint8_t> keep);

enum class PoolKind { None, Avg, Max };
PoolKind parse_pool(const std::string& s, const std::string& policy);
// Stride-1 pooling with padding kernel/2: avg counts the zero padding (PyTorch
// count_include_pad), max ignores it. Kernel 1 or PoolKind::None returns x unchanged.
std::vector<float> pool1d(std::span<const float> x, int kernel, PoolKind kind);

// How a GQA group's query heads combine their scores: into one keep-set per KV head (mean, max,
// sum), or not at all (per_query_head: one keep-set per query head, K/V copied per head).
enum class GqaAgg { Mean, Max, Sum, PerQueryHead };
GqaAgg parse_gqa(const std::string& s, const std::string& policy);
const char* gqa_name(GqaAgg a);
// Combines the per-query-head scores of one GQA group into one score per token.
std::vector<float> aggregate_group(const std::vector<std::vector<float>>& per_q_head, GqaAgg agg);

// Per-query-head scores of a whole layer ([n_q_heads]) turned into plan entries: one per KV head
// (aggregated over each group) or, for PerQueryHead, one per query head.
std::vector<HeadScores> group_scores(std::vector<HeadScores> per_q_head, int group, GqaAgg agg);

// Sum over rows of an attention matrix [rows, n] -> [n].
std::vector<float> column_sums(const MatrixView& a);

// Policies whose statistics need the queries of every prompt token (from `first` on) check it
// here, unless the user accepted the recorded subset (parameter queries=recorded). Throws
// naming the policy, how many were recorded and how to fix it.
void require_all_prompt_queries(const LayerSignals& s, std::int64_t first, const std::string& policy);

// Marks the last `window` of n tokens (and the first `sinks`) as protected.
std::vector<std::uint8_t> protect_ends(std::int64_t n, std::int64_t sinks, std::int64_t window);
// The same over a head's cache: entries whose token index is below `sinks`, and the last
// `window` entries.
std::vector<std::uint8_t> protect_cached(std::span<const std::int32_t> cached, std::int64_t sinks, std::int64_t window);

// A '/'-separated list of segment names (system, context, question, generated; or "none") as
// LayerSignals::segments() codes; errors name the policy and parameter.
std::set<int> parse_segment_list(const std::string& list, const std::string& policy, const std::string& param);

// Entries in KV head kv's cache.
inline std::int64_t cache_size(const LayerSignals& s, int kv) { return static_cast<std::int64_t>(s.cached(kv).size()); }

// Default selection: every entry keeps its own top tokens: budget.tokens per KV-head entry, or
// budget.tokens * n_kv / n_entries when there is one entry per query head.
LayerPlan select_uniform(const std::vector<HeadScores>& scores, const Budget& budget, int n_kv_heads);

// A policy defined by its scores; selection is uniform top-B unless overridden.
class ScoringPolicy : public Policy {
 public:
  virtual std::vector<HeadScores> score(const LayerSignals& signals) const = 0;
  // score(), computed once per layer and shared by every budget of this policy object.
  const std::vector<HeadScores>& cached_score(const LayerSignals& signals) const;
  // False when compress() does more than "each head keeps its top budget" (budgets per layer,
  // budget-dependent protection, decode-time eviction): wrappers that re-allocate budgets from
  // score() alone would silently drop that part of the rule.
  virtual bool selection_is_uniform() const { return true; }
  LayerPlan compress(const LayerSignals& signals, const Budget& budget) const override {
    return select_uniform(cached_score(signals), budget, signals.geometry().n_kv_heads);
  }
};

}  // namespace kvsim
