// KVzip — Kim et al., "KVzip: Query-Agnostic KV Cache Compression with Context Reconstruction",
// NeurIPS 2025 (snu-mllab/KVzip; kvpress KVzipPress). Rule: a context KV pair's score is the
// largest attention it receives, over the group's query heads and the rows of the model repeating
// the context (softmax over the system prefix, the pair's own chunk and the repeat rows so far);
// keep the top scores over every layer and head (level=model, the original's), of each layer
// (level=layer) or of each head (level=head), the system prefix and every token outside the
// repeated context always.
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

enum class Level { Model, Layer, Head };

// Keeps `per_head` tokens per KV head on average over the given layers: protected tokens first,
// then the best unprotected scores wherever they are, one threshold over every layer and head
// (ties keep the more recent token, then the later layer, then the higher head). When the
// protected tokens alone fill the budget each head keeps its own top `per_head` (select_uniform).
std::vector<LayerPlan> select_over(const std::vector<const std::vector<HeadScores>*>& layers, const Budget& budget) {
  std::int64_t heads = 0, pinned = 0;
  for (const auto* scores : layers)
    for (const HeadScores& hs : *scores) {
      ++heads;
      for (auto p : hs.protect) pinned += p;
    }
  const std::int64_t total = budget.tokens * heads;
  std::vector<LayerPlan> plans;
  if (pinned >= total) {
    for (const auto* scores : layers) plans.push_back(select_uniform(*scores, budget, static_cast<int>(scores->size())));
    return plans;
  }
  struct Item {
    float score;
    std::int32_t token;
    int layer, head;
  };
  std::vector<Item> items;
  for (std::size_t l = 0; l < layers.size(); ++l)
    for (std::size_t h = 0; h < layers[l]->size(); ++h) {
      const HeadScores& hs = (*layers[l])[h];
      for (std::size_t m = 0; m < hs.score.size(); ++m)
        if (hs.protect.empty() || !hs.protect[m])
          items.push_back({hs.score[m], static_cast<std::int32_t>(m), static_cast<int>(l), static_cast<int>(h)});
    }
  const auto take = static_cast<std::size_t>(std::min<std::int64_t>(total - pinned, static_cast<std::int64_t>(items.size())));
  auto better = [](const Item& a, const Item& b) {
    if (a.score != b.score) return a.score > b.score;
    if (a.token != b.token) return a.token > b.token;
    if (a.layer != b.layer) return a.layer > b.layer;
    return a.head > b.head;
  };
  std::nth_element(items.begin(), items.begin() + static_cast<std::ptrdiff_t>(take), items.end(), better);
  std::vector<std::vector<std::vector<std::uint8_t>>> keep(layers.size());
  for (std::size_t l = 0; l < layers.size(); ++l)
    for (const HeadScores& hs : *layers[l]) {
      auto& k = keep[l].emplace_back(hs.score.size(), 0);
      for (std::size_t m = 0; m < hs.protect.size(); ++m) k[m] = hs.protect[m];
    }
  for (std::size_t i = 0; i < take; ++i)
    keep[static_cast<std::size_t>(items[i].layer)][static_cast<std::size_t>(items[i].head)][static_cast<std::size_t>(items[i].token)] = 1;
  for (const auto& layer : keep) {
    LayerPlan& plan = plans.emplace_back();
    for (const auto& k : layer) plan.heads.push_back(plan_from_mask(k));
  }
  return plans;
}

// One layer's selection (level=model on one layer is level=layer).
LayerPlan select(const std::vector<HeadScores>& scores, const Budget& budget, Level level) {
  if (level == Level::Head) return select_uniform(scores, budget, static_cast<int>(scores.size()));
  return select_over({&scores}, budget).front();
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
  double state_bytes_per_head() const override { return level_ != Level::Head ? 4.0 : 0.0; }  // ragged lengths
  bool selects_across_layers() const override { return level_ == Level::Model; }
  // level=model: each layer's scores, then one selection over all of them (every layer's plan).
  std::shared_ptr<const void> layer_summary(const LayerSignals& s) const override {
    return std::make_shared<const std::vector<HeadScores>>(cached_score(s));
  }
  std::shared_ptr<const void> select_across_layers(const std::vector<std::shared_ptr<const void>>& summaries,
                                                   const Budget& budget) const override {
    std::vector<const std::vector<HeadScores>*> layers;
    for (const auto& x : summaries) layers.push_back(static_cast<const std::vector<HeadScores>*>(x.get()));
    return std::make_shared<const std::vector<LayerPlan>>(select_over(layers, budget));
  }
  LayerPlan compress(const LayerSignals& s, const Budget& budget) const override {
    // level=model without a selection: a budget that fits the cache (needs_compression's probe).
    if (level_ != Level::Model || !budget.across_layers) return select(cached_score(s), budget, level_);
    const auto& plans = *static_cast<const std::vector<LayerPlan>*>(budget.across_layers.get());
    return plans.at(static_cast<std::size_t>(s.layer()));
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

Level parse_level(const Params& p) {
  const std::string level = p.choice("level", {"model", "layer", "head"});
  return level == "model" ? Level::Model : level == "layer" ? Level::Layer : Level::Head;
}

}  // namespace

KVSIM_REGISTER_POLICY(PolicyInfo{
    "kvzip", "query-agnostic: max attention a context KV pair gets while the model repeats the context (needs capture --repeat-pass)",
    "Kim et al., NeurIPS 2025 (snu-mllab/KVzip), methods.md §8",
    {{"level", "model", "model: one threshold over every layer and head (KVzip's) | layer: over the layer's heads | head: top per head"}},
    [](const Params& p) { return std::make_unique<Kvzip>(parse_level(p)); }});

KVSIM_REGISTER_POLICY(PolicyInfo{
    "kvzip_proxy",
    "[proxy] KVzip's selection over the prefill attention of the context onto itself: NOT KVzip's signal, for traces "
    "without the repeat pass",
    "methods.md §8 (Simulator note)",
    {{"level", "model", "model | layer | head, as kvzip"},
     {"queries", "all", "all: every context query (else an error) | recorded: the recorded ones only"}},
    [](const Params& p) {
      return std::make_unique<KvzipProxy>(parse_level(p), p.choice("queries", {"all", "recorded"}) == "all");
    }});

}  // namespace kvsim
