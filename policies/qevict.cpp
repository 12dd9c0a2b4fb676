// QEvict — three tiers instead of keep/drop (seed idea; no paper or code found, methods.md §10.c,
// our reading [interp]; nearest published design: ARKV, arXiv 2603.08727).
// Rule: cut each head's cache into windows of `window` tokens snapped to prompt-structure
// boundaries; pinned windows (system prompt, question, sinks, recent tokens) stay fp16; the others
// are ranked by mean (or max) token score and fill the fp16 tier up to `hi_share` of the byte
// budget, then the intN tier (recoverable: a host copy stays), the rest is deleted. In decode the
// cache is re-tiered every `retier` steps by mean attention per observation (the prompt score
// counting as the first), with pins held for tokens that join while decoding.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <set>

#include "core/error.h"
#include "policies/base_scorer.h"
#include "policies/quantized_tier.h"
#include "policies/registry.h"
#include "policies/selection.h"

namespace kvsim {
namespace {

enum class WindowScore { Mean, Max };

constexpr double kScoreBytes = 4.0;  // fp32 accumulated score per token, kept while decoding

struct TierSpec {
  IntSpec quant;
  int window = 32;
  int sinks = 4;
  int recent = 32;
  double hi_share = 0.5;
  WindowScore agg = WindowScore::Mean;
  std::set<int> pinned_segments;
  int retier = 128;
};

// Tiers of one head's cache: tokens in cache order with their scores, segment codes (-1 past
// the prompt) and token indices. `budget` is the head's byte budget.
HeadPlan assign_tiers(const TierSpec& t, std::span<const float> score, std::span<const int> segment,
                      std::span<const std::int32_t> tokens, std::span<const std::uint8_t> protect, double budget,
                      int head_dim) {
  const auto n = static_cast<std::int64_t>(score.size());
  // Every kept token also costs the policy's per-token state (the decode score), in the budget.
  const double state = t.retier > 0 ? kScoreBytes : 0.0;
  const double fp16 = codec_token_bytes(TokenCodec::Fp16, head_dim) + state;
  const double quant = 2 * int_row_bytes(t.quant, head_dim) + state;
  const TokenCodec qcode = int_codec(t.quant.bits);
  std::vector<std::uint8_t> pinned(static_cast<std::size_t>(n), 0);
  for (std::int64_t m = 0; m < n; ++m) {
    const auto i = static_cast<std::size_t>(m);
    pinned[i] = tokens[i] < t.sinks || m >= n - t.recent || t.pinned_segments.count(segment[i]) ||
                (!protect.empty() && protect[i]);
  }
  // Windows: runs of consecutive tokens of one segment and one pinned flag, cut every `window`
  // tokens (a gap left by deleted tokens also ends a window).
  struct Window {
    std::int64_t begin, end;
    bool pinned;
    double confidence;
  };
  std::vector<Window> windows;
  for (std::int64_t m = 0; m < n;) {
    std::int64_t e = m + 1;
    const auto same = [&](std::int64_t x) {
      const auto i = static_cast<std::size_t>(x);
      return segment[i] == segment[static_cast<std::size_t>(m)] && pinned[i] == pinned[static_cast<std::size_t>(m)] &&
             tokens[i] == tokens[i - 1] + 1;
    };
    while (e < n && e - m < t.window && same(e)) ++e;
    double conf = t.agg == WindowScore::Max ? -std::numeric_limits<double>::infinity() : 0.0;
    for (std::int64_t x = m; x < e; ++x) {
      const double v = score[static_cast<std::size_t>(x)];
      conf = t.agg == WindowScore::Max ? std::max(conf, v) : conf + v / static_cast<double>(e - m);
    }
    windows.push_back({m, e, pinned[static_cast<std::size_t>(m)] != 0, conf});
    m = e;
  }
  // Pinned first (the most recent first), then by confidence (ties: the more recent window).
  std::vector<std::size_t> order(windows.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (windows[a].pinned != windows[b].pinned) return windows[a].pinned;
    if (!windows[a].pinned && windows[a].confidence != windows[b].confidence)
      return windows[a].confidence > windows[b].confidence;
    return a > b;
  });
  double pinned_bytes = 0;
  for (const Window& w : windows)
    if (w.pinned) pinned_bytes += fp16 * static_cast<double>(w.end - w.begin);
  // The fp16 tier takes whole windows up to its share (pins always, while the budget holds).
  const double hi_cap = std::min(budget, std::max(pinned_bytes, t.hi_share * budget));
  HeadPlan plan;
  plan.codec.assign(static_cast<std::size_t>(n), TokenCodec::Drop);
  double used = 0;
  std::size_t k = 0;
  for (; k < order.size(); ++k) {
    const Window& w = windows[order[k]];
    const double cost = fp16 * static_cast<double>(w.end - w.begin);
    if (used + cost > hi_cap) break;
    for (std::int64_t x = w.begin; x < w.end; ++x) plan.codec[static_cast<std::size_t>(x)] = TokenCodec::Fp16;
    used += cost;
  }
  // The quantized tier takes the next windows while they fit; the first that does not fit
  // keeps its best tokens (ties: the more recent), and the rest is deleted.
  for (; k < order.size(); ++k) {
    const Window& w = windows[order[k]];
    const std::int64_t len = w.end - w.begin;
    const auto room = static_cast<std::int64_t>(std::floor((budget - used) / quant + 1e-9));
    if (room <= 0) break;
    if (room >= len) {
      for (std::int64_t x = w.begin; x < w.end; ++x) plan.codec[static_cast<std::size_t>(x)] = qcode;
      used += quant * static_cast<double>(len);
      continue;
    }
    const auto mask = top_k_mask(score.subspan(static_cast<std::size_t>(w.begin), static_cast<std::size_t>(len)), room);
    for (std::int64_t x = w.begin; x < w.end; ++x)
      if (mask[static_cast<std::size_t>(x - w.begin)]) plan.codec[static_cast<std::size_t>(x)] = qcode;
    used += quant * static_cast<double>(room);
    break;
  }
  return plan;
}

// Decode scores in one unit for every token: mean attention per observation. The base scorer's
// prompt scores (window sums, pooled, or signed: their scale is the base's own) are shifted to be
// non-negative and normalised to sum 1 over the cache, and count as one observation (an attention
// row also sums to 1); each later step adds the token's attention (averaged over the group) as
// one more. A token that joins while decoding is then scored on the scale of the prompt's tokens
// instead of starting at 0 against window sums [interp].
struct DecodeScore {
  double sum = 0;
  std::int64_t seen = 0;
  double value() const { return seen ? sum / static_cast<double>(seen) : 0.0; }
};

class QevictDecode : public DecodeState {
 public:
  QevictDecode(const TierSpec& t, const LayerSignals& s, const std::vector<HeadScores>& scores, double budget)
      : t_(t), group_(s.geometry().group()), head_dim_(s.geometry().head_dim), budget_(budget) {
    const auto seg = s.segments();
    segments_.assign(seg.begin(), seg.end());
    for (int kv = 0; kv < s.geometry().n_kv_heads; ++kv) {
      const auto cached = s.cached(kv);
      const std::vector<float>& base = scores[static_cast<std::size_t>(kv)].score;
      double lo = 0, total = 0;
      if (!base.empty()) lo = *std::min_element(base.begin(), base.end());
      for (float x : base) total += x - lo;
      auto& acc = score_.emplace_back();
      for (std::size_t m = 0; m < cached.size(); ++m)
        acc[cached[m]] = {total > 0 ? (base[m] - lo) / total : 1.0 / static_cast<double>(cached.size()), 1};
    }
  }
  // Evicts nothing between re-tiers: new tokens join fp16 and the cache exceeds its budget by at
  // most `retier` tokens, as KIVI's residual window does. The joining token's segment is kept so
  // pins (question tokens after a query-agnostic cut, pin=generated) hold at the re-tier.
  void step(const DecodeStep& s, std::vector<std::vector<std::int32_t>>& evict) override {
    (void)evict;
    const auto t = static_cast<std::size_t>(s.token);
    if (t >= segments_.size()) segments_.resize(t + 1, -1);
    segments_[t] = s.segment;
    for (std::size_t kv = 0; kv < s.cache.size(); ++kv) {
      auto& acc = score_[kv];
      const auto& cache = s.cache[kv];
      for (std::size_t m = 0; m < cache.size(); ++m) {
        double w = 0;
        for (int r = 0; r < group_; ++r)
          w += s.attention[kv * static_cast<std::size_t>(group_) + static_cast<std::size_t>(r)][m];
        DecodeScore& d = acc[cache[m]];
        d.sum += w / group_;
        ++d.seen;
      }
    }
    ++steps_;
  }
  bool retier(const DecodeStep& s, LayerPlan& plan) override {
    if (t_.retier <= 0 || steps_ % t_.retier != 0) return false;
    plan.heads.clear();
    for (std::size_t kv = 0; kv < s.cache.size(); ++kv) {
      const auto& cache = s.cache[kv];
      std::vector<float> score(cache.size());
      std::vector<int> seg(cache.size());
      for (std::size_t m = 0; m < cache.size(); ++m) {
        score[m] = static_cast<float>(score_[kv].at(cache[m]).value());
        const auto tok = static_cast<std::size_t>(cache[m]);
        seg[m] = tok < segments_.size() ? segments_[tok] : -1;
      }
      plan.heads.push_back(assign_tiers(t_, score, seg, cache, {}, budget_, head_dim_));
      for (std::size_t m = 0; m < cache.size(); ++m)
        if (plan.heads.back().codec[m] == TokenCodec::Drop) score_[kv].erase(cache[m]);
    }
    return true;
  }

 private:
  TierSpec t_;
  int group_, head_dim_;
  double budget_;
  std::vector<int> segments_;  // by token index: the prompt's, then each token's as it joins
  std::vector<std::map<std::int32_t, DecodeScore>> score_;  // per KV head
  std::int64_t steps_ = 0;
};

class Qevict : public Policy {
 public:
  Qevict(TierSpec t, std::unique_ptr<Policy> base) : t_(std::move(t)), base_(std::move(base)), codec_(t_.quant, true) {}
  const KvCodec* codec() const override { return &codec_; }
  double state_bytes_per_token() const override { return t_.retier > 0 ? kScoreBytes : 0.0; }
  std::int64_t decode_growth() const override { return t_.retier; }
  LayerPlan compress(const LayerSignals& s, const Budget& budget) const override {
    check_int_spec(t_.quant, s.geometry().head_dim);
    const auto& scores = static_cast<const ScoringPolicy&>(*base_).cached_score(s);
    if (static_cast<int>(scores.size()) != s.geometry().n_kv_heads)
      throw Error("policy qevict: the base must score per KV head (gqa=per_query_head is not supported)");
    const double bytes = head_byte_budget(s, budget);
    LayerPlan plan;
    for (int kv = 0; kv < s.geometry().n_kv_heads; ++kv) {
      const auto cached = s.cached(kv);
      std::vector<int> seg(cached.size());
      for (std::size_t m = 0; m < cached.size(); ++m) seg[m] = s.segments()[static_cast<std::size_t>(cached[m])];
      const HeadScores& hs = scores[static_cast<std::size_t>(kv)];
      plan.heads.push_back(assign_tiers(t_, hs.score, seg, cached, hs.protect, bytes, s.geometry().head_dim));
    }
    return plan;
  }
  std::unique_ptr<DecodeState> start_decode(const LayerSignals& s, const LayerPlan& initial,
                                            const Budget& budget) const override {
    (void)initial;
    if (t_.retier <= 0) return nullptr;
    const auto& scores = static_cast<const ScoringPolicy&>(*base_).cached_score(s);
    return std::make_unique<QevictDecode>(t_, s, scores, head_byte_budget(s, budget));
  }

 private:
  TierSpec t_;
  std::unique_ptr<Policy> base_;
  IntCodec codec_;
};

}  // namespace

KVSIM_REGISTER_POLICY(PolicyInfo{
    "qevict",
    "[interp] three tiers: structure-snapped windows ranked by score go fp16, then intN (host copy kept, "
    "recoverable), then deleted; re-tiered in decode",
    "seed idea QEvict (not found), methods.md §10.c; cf. ARKV arXiv 2603.08727",
    {{"base", "snapkv", "scoring policy giving token scores (its parameters follow '/')"},
     {"window", "32", "window length in tokens (windows also break at segment boundaries)"},
     {"agg", "mean", "window confidence: mean | max of its tokens' scores"},
     {"hi_share", "0.5",
      "share of the byte budget for the fp16 tier (pins may exceed it); 1 = keep/drop, 0 = quantized/drop"},
     {"bits", "4", "quantized tier: 2 | 4 | 8 bits per value"},
     {"group", "32", "quantized tier: channels per scale group"},
     {"symmetric", "false", "quantized tier: absmax (true) or min-max (false)"},
     {"sinks", "4", "first tokens pinned to fp16"},
     {"recent", "32", "most recent cached tokens pinned to fp16"},
     {"pin", "system/question", "segments pinned to fp16, '/'-separated (or none)"},
     {"retier", "128", "decode: re-tier every this many steps by score + accumulated attention (0: never)"}},
    [](const Params& p) {
      TierSpec t;
      t.quant =
          IntSpec{static_cast<int>(p.integer("bits")), static_cast<int>(p.integer("group")), p.boolean("symmetric")};
      int_codec(t.quant.bits);
      t.window = static_cast<int>(p.integer("window"));
      t.sinks = static_cast<int>(p.integer("sinks"));
      t.recent = static_cast<int>(p.integer("recent"));
      t.hi_share = p.number("hi_share");
      t.agg = p.choice("agg", {"mean", "max"}) == "max" ? WindowScore::Max : WindowScore::Mean;
      t.pinned_segments = parse_segment_list(p.text("pin"), "qevict", "pin");
      t.retier = static_cast<int>(p.integer("retier"));
      if (t.window < 1)
        throw Error("policy qevict: parameter 'window' = " + std::to_string(t.window) + ", expected >= 1");
      if (t.sinks < 0 || t.recent < 0 || t.retier < 0)
        throw Error("policy qevict: parameters 'sinks', 'recent' and 'retier' must be >= 0");
      if (!(t.hi_share >= 0 && t.hi_share <= 1))
        throw Error("policy qevict: parameter 'hi_share' = " + p.text("hi_share") + ", expected a number in [0, 1]");
      return std::make_unique<Qevict>(std::move(t), make_base_scorer(p.text("base"), "qevict"));
    }});

}  // namespace kvsim
