// KVzip — Kim et al., "KVzip: Query-Agnostic KV Cache Compression with Context Reconstruction",
// NeurIPS 2025 (snu-mllab/KVzip; kvpress KVzipPress). Rule: a context KV pair's score is the
// largest attention it receives, over the group's query heads and the rows of the model repeating
// the context (softmax over the system prefix, the pair's own chunk and the repeat rows so far);
// keep the top scores of the layer (level=layer) or of each head (level=head), the system prefix
// and every token outside the repeated context always.
// kvzip_proxy: the same selection over the prefill attention of the context onto itself (max over
// the context's own queries), for traces captured without --repeat-pass: NOT KVzip's signal.
#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "policies/registry.h"
#include "policies/selection.h"

namespace kvsim {
namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

enum class Level { Layer, Head };

// Keeps `budget` tokens per KV head on average: protected tokens first, then the layer's best
// scores wherever they are (Layer), or each head's own best (Head).
LayerPlan select(const std::vector<HeadScores>& scores, const Budget& budget, Level level) {
  if (level == Level::Head) return select_uniform(scores, budget, static_cast<int>(scores.size()));
  std::int64_t total = budget.tokens * static_cast<std::int64_t>(scores.size()), pinned = 0;
  for (const HeadScores& hs : scores)
    for (auto p : hs.protect) pinned += p;
  if (pinned >= total) return select_uniform(scores, budget, static_cast<int>(scores.size()));
  // One threshold over the layer: the (total - pinned)-th best unprotected score; ties keep the
  // more recent token, then the higher head.
  struct Item {
    float score;
    std::int32_t token;
    int head;
  };
  std::vector<Item> items;
  for (std::size_t h = 0; h < scores.size(); ++h)
    for (std::size_t m = 0; m < scores[h].score.size(); ++m)
      if (scores[h].protect.empty() || !scores[h].protect[m])
        items.push_back({scores[h].score[m], static_cast<std::int32_t>(m), static_cast<int>(h)});
  const auto take = static_cast<std::size_t>(std::min<std::int64_t>(total - pinned, static_cast<std::int64_t>(items.size())));
  auto better = [](const Item& a, const Item& b) {
    if (a.score != b.score) return a.score > b.score;
    if (a.token != b.token) return a.token > b.token;
    return a.head > b.head;
  };
  std::nth_element(items.begin(), items.begin() + static_cast<std::ptrdiff_t>(take), items.end(), better);
  LayerPlan plan;
  std::vector<std::vector<std::uint8_t>> keep(scores.size());
  for (std::size_t h = 0; h < scores.size(); ++h) {
    keep[h].assign(scores[h].score.size(), 0);
    for (std::size_t m = 0; m < scores[h].protect.size(); ++m) keep[h][m] = scores[h].protect[m];
  }
  for (std::size_t i = 0; i < take; ++i) keep[static_cast<std::size_t>(items[i].head)][static_cast<std::size_t>(items[i].token)] = 1;
  for (const auto& k : keep) plan.heads.push_back(plan_from_mask(k));
  return plan;
}

// Tokens outside the repeated context (system prefix, question, anything after) are kept.
std::vector<std::uint8_t> outside_context(std::span<const std::int32_t> cached, std::int64_t begin, std::int64_t end) {
  std::vector<std::uint8_t> p(cached.size(), 0);
  for (std::size_t m = 0; m < cached.size(); ++m) p[m] = cached[m] < begin || cached[m] >= end;
  return p;
}

class KvzipBase : public ScoringPolicy {
 public:
  explicit KvzipBase(Level level) : level_(level) {}
  bool selection_is_uniform() const override { return level_ == Level::Head; }
  double state_bytes_per_head() const override { return level_ == Level::Layer ? 4.0 : 0.0; }  // ragged lengths
  LayerPlan compress(const LayerSignals& s, const Budget& budget) const override {
    return select(cached_score(s), budget, level_);
  }

 private:
  Level level_;
};

class Kvzip : public KvzipBase {
 public:
  using KvzipBase::KvzipBase;
  bool needs_repeat_pass() const override { return true; }
  std::vector<HeadScores> score(const LayerSignals& s) const override {
    const RepeatPassView* rp = s.repeat_pass();
    if (!rp)
      throw Error("policy kvzip needs KVzip's reconstruction pass, which this trace did not record (capture with "
                  "`kvsim capture --repeat-pass`, or use kvzip_proxy: prefill attention, not KVzip's signal) or which "
                  "is not handed out at compression cuts (--compress-every: the pass repeats the whole context, so it "
                  "exists only once the context is complete)");
    const ModelGeometry& g = s.geometry();
    const int d = g.head_dim, G = g.group(), Hq = g.n_q_heads, Hkv = g.n_kv_heads;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    if (rp->chunks.empty()) throw Error("policy kvzip: the reconstruction pass has no chunks");
    const std::int64_t ctx_begin = rp->chunks.front().begin, ctx_end = rp->chunks.back().end;
    std::vector<HeadScores> out(static_cast<std::size_t>(Hkv));
    for (int kv = 0; kv < Hkv; ++kv) {
      const auto cached = s.cached(kv);
      const MatrixView K = s.keys(kv);
      HeadScores& hs = out[static_cast<std::size_t>(kv)];
      hs.score.assign(cached.size(), 0.0f);
      hs.protect = outside_context(cached, ctx_begin, ctx_end);
      // The sinks every chunk's rows attend to: the cached tokens before the context.
      std::vector<std::size_t> sinks;
      for (std::size_t m = 0; m < cached.size() && cached[m] < ctx_begin; ++m) sinks.push_back(m);
      for (const auto& ch : rp->chunks) {
        std::vector<std::size_t> own;  // cached entries of this chunk's context tokens
        for (std::size_t m = 0; m < cached.size(); ++m)
          if (cached[m] >= ch.begin && cached[m] < ch.end) own.push_back(m);
        const auto rows = static_cast<Eigen::Index>(ch.row_end - ch.row_begin);
        const auto ns = static_cast<Eigen::Index>(sinks.size()), no = static_cast<Eigen::Index>(own.size());
        RowMat keys(ns + no + rows, d);
        for (Eigen::Index i = 0; i < ns; ++i) keys.row(i) = Eigen::Map<const Eigen::RowVectorXf>(K.row(static_cast<std::int64_t>(sinks[static_cast<std::size_t>(i)])), d);
        for (Eigen::Index i = 0; i < no; ++i) keys.row(ns + i) = Eigen::Map<const Eigen::RowVectorXf>(K.row(static_cast<std::int64_t>(own[static_cast<std::size_t>(i)])), d);
        for (Eigen::Index r = 0; r < rows; ++r)
          keys.row(ns + no + r) = Eigen::Map<const Eigen::RowVectorXf>(rp->k + ((ch.row_begin + r) * Hkv + kv) * d, d);
        for (int h = 0; h < G; ++h) {
          const int qh = kv * G + h;
          const Eigen::Map<const RowMat, 0, Eigen::OuterStride<>> q(rp->q + (ch.row_begin * Hq + qh) * d, rows, d,
                                                                     Eigen::OuterStride<>(Hq * d));
          RowMat a = (q * scale) * keys.transpose();
          for (Eigen::Index r = 0; r < rows; ++r) {
            auto row = a.row(r);
            const Eigen::Index seen = ns + no + r + 1;  // causal among the repeat rows
            const float mx = row.head(seen).maxCoeff();
            row.head(seen) = (row.head(seen).array() - mx).exp();
            row.head(seen) /= row.head(seen).sum();
            for (Eigen::Index i = 0; i < no; ++i) {
              float& sc = hs.score[own[static_cast<std::size_t>(i)]];
              sc = std::max(sc, row(ns + i));
            }
          }
        }
      }
    }
    return out;
  }
};

class KvzipProxy : public KvzipBase {
 public:
  KvzipProxy(Level level, bool all_queries) : KvzipBase(level), all_queries_(all_queries) {}
  std::vector<HeadScores> score(const LayerSignals& s) const override {
    const ModelGeometry& g = s.geometry();
    const auto seg = s.segments();
    // The context: Context-segment tokens seen; its own queries stand in for the repeat rows.
    std::int64_t begin = -1, end = -1;
    for (std::int64_t t = 0; t < s.n_tokens(); ++t)
      if (seg[static_cast<std::size_t>(t)] == 1) {
        if (begin < 0) begin = t;
        end = t + 1;
      }
    std::vector<HeadScores> out(static_cast<std::size_t>(g.n_kv_heads));
    for (int kv = 0; kv < g.n_kv_heads; ++kv) {
      const auto cached = s.cached(kv);
      HeadScores& hs = out[static_cast<std::size_t>(kv)];
      hs.score.assign(cached.size(), 0.0f);
      hs.protect = outside_context(cached, begin, end);
    }
    if (begin < 0) return out;
    if (all_queries_) require_all_prompt_queries(s, begin, "kvzip_proxy");
    const auto rows = s.observed_rows();
    for (int qh = 0; qh < g.n_q_heads; ++qh) {
      HeadScores& hs = out[static_cast<std::size_t>(qh / g.group())];
      s.visit_observed_attention(qh, [&](std::int64_t first, const MatrixView& a) {
        for (std::int64_t r = 0; r < a.rows; ++r) {
          const auto row_token = rows[static_cast<std::size_t>(first + r)];
          if (row_token < begin || row_token >= end) continue;
          const float* row = a.row(r);
          for (std::int64_t m = 0; m < a.cols; ++m) hs.score[static_cast<std::size_t>(m)] = std::max(hs.score[static_cast<std::size_t>(m)], row[m]);
        }
      });
    }
    return out;
  }

 private:
  bool all_queries_;
};

Level parse_level(const Params& p) { return p.choice("level", {"layer", "head"}) == "layer" ? Level::Layer : Level::Head; }

}  // namespace

KVSIM_REGISTER_POLICY(PolicyInfo{
    "kvzip", "query-agnostic: max attention a context KV pair gets while the model repeats the context (needs capture --repeat-pass)",
    "Kim et al., NeurIPS 2025 (snu-mllab/KVzip), methods.md §8",
    {{"level", "layer", "layer: one threshold over the layer's heads (ours; KVzip's default is over all layers) | head: top per head"}},
    [](const Params& p) { return std::make_unique<Kvzip>(parse_level(p)); }});

KVSIM_REGISTER_POLICY(PolicyInfo{
    "kvzip_proxy",
    "[proxy] KVzip's selection over the prefill attention of the context onto itself: NOT KVzip's signal, for traces "
    "without the repeat pass",
    "methods.md §8 (Simulator note)",
    {{"level", "layer", "layer | head, as kvzip"},
     {"queries", "all", "all: every context query (else an error) | recorded: the recorded ones only"}},
    [](const Params& p) {
      return std::make_unique<KvzipProxy>(parse_level(p), p.choice("queries", {"all", "recorded"}) == "all");
    }});

}  // namespace kvsim
