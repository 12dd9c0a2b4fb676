#include "policies/selection.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "core/error.h"

namespace kvsim {

std::vector<std::uint8_t> top_k_mask(std::span<const float> score, std::int64_t k,
                                     std::span<const std::uint8_t> protect) {
  const auto n = static_cast<std::int64_t>(score.size());
  std::vector<std::uint8_t> keep(static_cast<std::size_t>(n), 0);
  k = std::clamp<std::int64_t>(k, 0, n);
  std::int64_t left = k;
  // Protected tokens first, most recent first when they alone exceed the budget.
  if (!protect.empty()) {
    for (std::int64_t j = n - 1; j >= 0 && left > 0; --j) {
      if (protect[static_cast<std::size_t>(j)]) {
        keep[static_cast<std::size_t>(j)] = 1;
        --left;
      }
    }
  }
  if (left == 0) return keep;
  std::vector<std::int32_t> order;
  order.reserve(static_cast<std::size_t>(n));
  for (std::int64_t j = 0; j < n; ++j)
    if (!keep[static_cast<std::size_t>(j)]) order.push_back(static_cast<std::int32_t>(j));
  auto better = [&](std::int32_t a, std::int32_t b) {
    const float sa = score[static_cast<std::size_t>(a)], sb = score[static_cast<std::size_t>(b)];
    return sa != sb ? sa > sb : a > b;  // tie: the more recent token wins
  };
  const auto take = std::min<std::int64_t>(left, static_cast<std::int64_t>(order.size()));
  std::nth_element(order.begin(), order.begin() + take, order.end(), better);
  for (std::int64_t i = 0; i < take; ++i) keep[static_cast<std::size_t>(order[static_cast<std::size_t>(i)])] = 1;
  return keep;
}

HeadPlan plan_from_mask(std::span<const std::uint8_t> keep) {
  HeadPlan p;
  p.codec.resize(keep.size());
  for (std::size_t j = 0; j < keep.size(); ++j) p.codec[j] = keep[j] ? TokenCodec::Fp16 : TokenCodec::Drop;
  return p;
}

PoolKind parse_pool(const std::string& s, const std::string& policy) {
  if (s == "avg") return PoolKind::Avg;
  if (s == "max") return PoolKind::Max;
  if (s == "none") return PoolKind::None;
  throw Error("policy " + policy + ": parameter 'pool' = '" + s + "', expected avg | max | none");
}

std::vector<float> pool1d(std::span<const float> x, int kernel, PoolKind kind) {
  std::vector<float> out(x.begin(), x.end());
  if (kind == PoolKind::None || kernel <= 1) return out;
  const auto n = static_cast<std::int64_t>(x.size());
  const std::int64_t half = kernel / 2;
  for (std::int64_t j = 0; j < n; ++j) {
    const std::int64_t lo = std::max<std::int64_t>(0, j - half),
                       hi = std::min<std::int64_t>(n - 1, j - half + kernel - 1);
    if (kind == PoolKind::Avg) {
      double s = 0;
      for (std::int64_t i = lo; i <= hi; ++i) s += x[static_cast<std::size_t>(i)];
      out[static_cast<std::size_t>(j)] = static_cast<float>(s / kernel);
    } else {
      float m = -std::numeric_limits<float>::infinity();
      for (std::int64_t i = lo; i <= hi; ++i) m = std::max(m, x[static_cast<std::size_t>(i)]);
      out[static_cast<std::size_t>(j)] = m;
    }
  }
  return out;
}

GqaAgg parse_gqa(const std::string& s, const std::string& policy) {
  if (s == "mean") return GqaAgg::Mean;
  if (s == "max") return GqaAgg::Max;
  if (s == "sum") return GqaAgg::Sum;
  if (s == "per_query_head") return GqaAgg::PerQueryHead;
  throw Error("policy " + policy + ": parameter 'gqa' = '" + s + "', expected mean | max | sum | per_query_head");
}

const char* gqa_name(GqaAgg a) {
  switch (a) {
    case GqaAgg::Mean:
      return "mean";
    case GqaAgg::Max:
      return "max";
    case GqaAgg::Sum:
      return "sum";
    case GqaAgg::PerQueryHead:
      return "per_query_head";
  }
  return "?";
}

std::vector<HeadScores> group_scores(std::vector<HeadScores> per_q_head, int group, GqaAgg agg) {
  if (agg == GqaAgg::PerQueryHead) return per_q_head;
  std::vector<HeadScores> out;
  for (std::size_t h = 0; h < per_q_head.size(); h += static_cast<std::size_t>(group)) {
    std::vector<std::vector<float>> scores;
    for (int r = 0; r < group; ++r) scores.push_back(std::move(per_q_head[h + static_cast<std::size_t>(r)].score));
    HeadScores hs;
    hs.score = aggregate_group(scores, agg);
    hs.protect = std::move(per_q_head[h].protect);
    out.push_back(std::move(hs));
  }
  return out;
}

std::vector<float> aggregate_group(const std::vector<std::vector<float>>& per_q_head, GqaAgg agg) {
  std::vector<float> out(per_q_head.front().size(),
                         agg == GqaAgg::Max ? -std::numeric_limits<float>::infinity() : 0.0f);
  for (const auto& s : per_q_head)
    for (std::size_t j = 0; j < out.size(); ++j) out[j] = agg == GqaAgg::Max ? std::max(out[j], s[j]) : out[j] + s[j];
  if (agg == GqaAgg::Mean)
    for (auto& x : out) x /= static_cast<float>(per_q_head.size());
  return out;
}

std::vector<float> column_sums(const MatrixView& a) {
  std::vector<float> out(static_cast<std::size_t>(a.cols), 0.0f);
  for (std::int64_t i = 0; i < a.rows; ++i) {
    const float* r = a.row(i);
    for (std::int64_t j = 0; j < a.cols; ++j) out[static_cast<std::size_t>(j)] += r[j];
  }
  return out;
}

void require_all_prompt_queries(const LayerSignals& s, std::int64_t first, const std::string& policy) {
  const auto rows = s.observed_rows();
  const std::int64_t needed = std::max<std::int64_t>(0, s.n_tokens() - first);
  std::int64_t have = 0;
  for (auto r : rows) have += r >= first;
  if (have < needed)
    throw Error("policy " + policy + " accumulates over every prompt query from token " + std::to_string(first) +
                ", but the trace recorded " + std::to_string(have) + " of " + std::to_string(needed) +
                "; capture all queries, or pass " + policy + ":queries=recorded to use the recorded ones only");
}

std::vector<std::uint8_t> protect_ends(std::int64_t n, std::int64_t sinks, std::int64_t window) {
  std::vector<std::uint8_t> p(static_cast<std::size_t>(n), 0);
  for (std::int64_t j = 0; j < std::min(sinks, n); ++j) p[static_cast<std::size_t>(j)] = 1;
  for (std::int64_t j = std::max<std::int64_t>(0, n - window); j < n; ++j) p[static_cast<std::size_t>(j)] = 1;
  return p;
}

const std::vector<HeadScores>& ScoringPolicy::cached_score(const LayerSignals& signals) const {
  const auto p = signals.memo(this, [&] { return std::make_shared<const std::vector<HeadScores>>(score(signals)); });
  return *static_cast<const std::vector<HeadScores>*>(p.get());
}

std::vector<std::uint8_t> protect_cached(std::span<const std::int32_t> cached, std::int64_t sinks,
                                         std::int64_t window) {
  const auto n = static_cast<std::int64_t>(cached.size());
  std::vector<std::uint8_t> p(static_cast<std::size_t>(n), 0);
  for (std::int64_t m = 0; m < n; ++m)
    if (cached[static_cast<std::size_t>(m)] < sinks || m >= n - window) p[static_cast<std::size_t>(m)] = 1;
  return p;
}

LayerPlan select_uniform(const std::vector<HeadScores>& scores, const Budget& budget, int n_kv_heads) {
  const std::int64_t tokens = budget.tokens * n_kv_heads / static_cast<std::int64_t>(scores.size());
  LayerPlan plan;
  for (const auto& h : scores) plan.heads.push_back(plan_from_mask(top_k_mask(h.score, tokens, h.protect)));
  return plan;
}

std::set<int> parse_segment_list(const std::string& list, const std::string& policy, const std::string& param) {
  // In the order of the trace schema's Segment enum (policies do not depend on traces/).
  static constexpr const char* kNames[] = {"system", "context", "question", "generated"};
  std::set<int> out;
  if (list == "none") return out;
  std::size_t at = 0;
  while (at <= list.size()) {
    const std::size_t slash = std::min(list.find('/', at), list.size());
    const std::string name = list.substr(at, slash - at);
    int code = -1;
    for (int c = 0; c < 4; ++c)
      if (name == kNames[c]) code = c;
    if (code < 0)
      throw Error("policy " + policy + ": parameter '" + param + "' names segment '" + name +
                  "', expected system/context/question/generated (or none)");
    out.insert(code);
    at = slash + 1;
  }
  return out;
}

}  // namespace kvsim
