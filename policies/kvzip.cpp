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
#include <exception>
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
    for (const auto* scores : layers)
      plans.push_back(select_uniform(*scores, budget, static_cast<int>(scores->size())));
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
  const auto take =
      static_cast<std::size_t>(std::min<std::int64_t>(total - pinned, static_cast<std::int64_t>(items.size())));
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
    keep[static_cast<std::size_t>(items[i].layer)][static_cast<std::size_t>(items[i].head)]
        [static_cast<std::size_t>(items[i].token)] = 1;
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

// The keys one chunk's repeat rows attend to: the sinks, the chunk's own cached tokens, then the
// repeat rows' own keys.
RowMat chunk_keys(const MatrixView& K, const std::vector<std::size_t>& sinks, const std::vector<std::size_t>& own,
                  const float* repeat_k, std::int64_t rows, std::int64_t stride) {
  const auto d = static_cast<Eigen::Index>(K.cols);
  const auto ns = static_cast<Eigen::Index>(sinks.size()), no = static_cast<Eigen::Index>(own.size());
  RowMat keys(ns + no + rows, d);
  auto key = [&](std::size_t m) {
    return Eigen::Map<const Eigen::RowVectorXf>(K.row(static_cast<std::int64_t>(m)), d);
  };
  for (Eigen::Index i = 0; i < ns; ++i) keys.row(i) = key(sinks[static_cast<std::size_t>(i)]);
  for (Eigen::Index i = 0; i < no; ++i) keys.row(ns + i) = key(own[static_cast<std::size_t>(i)]);
  for (Eigen::Index r = 0; r < rows; ++r)
    keys.row(ns + no + r) = Eigen::Map<const Eigen::RowVectorXf>(repeat_k + r * stride, d);
  return keys;
}

// The largest softmax weight one query head's repeat rows give each of the `no` own tokens: rows
// attend to the sinks, the own tokens and the repeat rows up to themselves. Row blocks stop at
// their causal edge, so the repeat rows' upper triangle is never computed.
Eigen::RowVectorXf max_attention(const RowMat& keys, Eigen::Index ns, Eigen::Index no, const float* q0,
                                 Eigen::Index rows, Eigen::Index stride, float scale) {
  constexpr Eigen::Index kBlock = 128;
  const auto d = keys.cols();
  Eigen::RowVectorXf best = Eigen::RowVectorXf::Zero(no);
  RowMat a;
  for (Eigen::Index first = 0; first < rows; first += kBlock) {
    const Eigen::Index count = std::min(kBlock, rows - first), cols = ns + no + first + count;
    const Eigen::Map<const RowMat, 0, Eigen::OuterStride<>> q(q0 + first * stride, count, d,
                                                              Eigen::OuterStride<>(stride));
    a.noalias() = (q * scale) * keys.topRows(cols).transpose();
    for (Eigen::Index r = 0; r < count; ++r) {
      auto row = a.row(r).head(ns + no + first + r + 1);
      row = (row.array() - row.maxCoeff()).exp();
      best = best.cwiseMax(row.segment(ns, no) / row.sum());
    }
  }
  return best;
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
      throw Error(
          "policy kvzip needs KVzip's reconstruction pass, which this trace did not record (capture with "
          "`kvsim capture --repeat-pass`, or use kvzip_proxy: prefill attention, not KVzip's signal) or which "
          "is not handed out at compression cuts (--compress-every: the pass repeats the whole context, so it "
          "exists only once the context is complete)");
    const ModelGeometry& g = s.geometry();
    const int d = g.head_dim, G = g.group(), Hq = g.n_q_heads, Hkv = g.n_kv_heads;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    if (rp->chunks.empty()) throw Error("policy kvzip: the reconstruction pass has no chunks");
    const std::int64_t ctx_begin = rp->chunks.front().begin, ctx_end = rp->chunks.back().end;
    std::vector<HeadScores> out(static_cast<std::size_t>(Hkv));
    std::vector<std::vector<std::size_t>> sinks(out.size());
    for (int kv = 0; kv < Hkv; ++kv) {
      const auto cached = s.cached(kv);
      HeadScores& hs = out[static_cast<std::size_t>(kv)];
      hs.score.assign(cached.size(), 0.0f);
      hs.protect = outside_context(cached, ctx_begin, ctx_end);
      // The sinks every chunk's rows attend to: the cached tokens before the context.
      for (std::size_t m = 0; m < cached.size() && cached[m] < ctx_begin; ++m)
        sinks[static_cast<std::size_t>(kv)].push_back(m);
    }
    for (const auto& ch : rp->chunks) {
      std::vector<std::vector<std::size_t>> own(out.size());  // cached entries of this chunk's context tokens
      std::vector<RowMat> keys(out.size());                   // sinks, own tokens, repeat rows
      for (int kv = 0; kv < Hkv; ++kv) {
        const auto cached = s.cached(kv);
        for (std::size_t m = 0; m < cached.size(); ++m)
          if (cached[m] >= ch.begin && cached[m] < ch.end) own[static_cast<std::size_t>(kv)].push_back(m);
        keys[static_cast<std::size_t>(kv)] =
            chunk_keys(s.keys(kv), sinks[static_cast<std::size_t>(kv)], own[static_cast<std::size_t>(kv)],
                       rp->k + (ch.row_begin * Hkv + kv) * d, ch.row_end - ch.row_begin, Hkv * d);
      }
      // Every query head on its own (a thread each where the caller is not threaded), then the
      // group's maximum.
      const auto rows = static_cast<Eigen::Index>(ch.row_end - ch.row_begin);
      std::vector<Eigen::RowVectorXf> best(static_cast<std::size_t>(Hq));
      std::exception_ptr failure;  // (bad_alloc) must not leave the OpenMP region
#pragma omp parallel for schedule(dynamic)
      for (int qh = 0; qh < Hq; ++qh) {
        const auto kv = static_cast<std::size_t>(qh / G);
        try {
          best[static_cast<std::size_t>(qh)] = max_attention(keys[kv], static_cast<Eigen::Index>(sinks[kv].size()),
                                                             static_cast<Eigen::Index>(own[kv].size()),
                                                             rp->q + (ch.row_begin * Hq + qh) * d, rows, Hq * d, scale);
        } catch (...) {
#pragma omp critical(kvsim_kvzip_failure)
          if (!failure) failure = std::current_exception();
        }
      }
      if (failure) std::rethrow_exception(failure);
      for (int qh = 0; qh < Hq; ++qh) {
        const auto kv = static_cast<std::size_t>(qh / G);
        for (std::size_t i = 0; i < own[kv].size(); ++i) {
          float& sc = out[kv].score[own[kv][i]];
          sc = std::max(sc, best[static_cast<std::size_t>(qh)](static_cast<Eigen::Index>(i)));
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
          for (std::int64_t m = 0; m < a.cols; ++m)
            hs.score[static_cast<std::size_t>(m)] = std::max(hs.score[static_cast<std::size_t>(m)], row[m]);
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
    "kvzip",
    "query-agnostic: max attention a context KV pair gets while the model repeats the context (needs capture "
    "--repeat-pass)",
    "Kim et al., NeurIPS 2025 (snu-mllab/KVzip), methods.md §8",
    {{"level", "model",
      "model: one threshold over every layer and head (KVzip's) | layer: over the layer's heads | head: top per head"}},
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
