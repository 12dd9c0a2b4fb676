// The CPU engine's refresh of cached rows: CacheBlend's selective recompute (docs/chunk-states.md).
#include <algorithm>
#include <string>

#include "core/error.h"
#include "model/llama_model.h"
#include "model/llama_model_impl.h"
#include "model/transformer_layer.h"

namespace kvsim {

namespace {

using layer_ops::Mat;

// Where each refreshed token sits in one entry; throws naming the first one the entry lacks.
std::vector<std::int64_t> rows_of(const KvEntry& e, std::span<const std::int64_t> indices, int layer) {
  std::vector<std::int64_t> rows;
  rows.reserve(indices.size());
  for (const std::int64_t t : indices) {
    const auto it = std::lower_bound(e.tokens.begin(), e.tokens.end(), static_cast<std::int32_t>(t));
    if (it == e.tokens.end() || *it != t)
      throw Error("refresh: token " + std::to_string(t) + " is not cached in layer " + std::to_string(layer) +
                  "; expected an uncompressed cache holding every refreshed row");
    rows.push_back(it - e.tokens.begin());
  }
  return rows;
}

struct Batch {
  std::vector<std::int64_t> rows;  // indices into the refreshed rows
};

// The rows of `active` (increasing) in each batch range.
std::vector<Batch> split(const std::vector<std::pair<std::int64_t, std::int64_t>>& ranges,
                         const std::vector<std::int64_t>& active) {
  std::vector<Batch> out;
  std::size_t i = 0;
  for (const auto& [b, e] : ranges) {
    Batch batch;
    for (; i < active.size() && active[i] < e; ++i)
      if (active[i] >= b) batch.rows.push_back(active[i]);
    if (!batch.rows.empty()) out.push_back(std::move(batch));
  }
  return out;
}

Mat gather(const Mat& x, const std::vector<std::int64_t>& rows) {
  Mat out(static_cast<Eigen::Index>(rows.size()), x.cols());
  for (std::size_t i = 0; i < rows.size(); ++i) out.row(static_cast<Eigen::Index>(i)) = x.row(rows[i]);
  return out;
}

template <typename T>
std::vector<T> pick(std::span<const T> v, const std::vector<std::int64_t>& rows) {
  std::vector<T> out;
  out.reserve(rows.size());
  for (const std::int64_t r : rows) out.push_back(v[static_cast<std::size_t>(r)]);
  return out;
}

// Writes the batch's K/V rows over the cached ones in every entry of the layer; returns each row's
// squared change (summed over KV heads) when `deviation` is wanted.
void replace_rows(std::vector<KvEntry>& entries, const std::vector<std::vector<std::int64_t>>& at, const Batch& batch,
                  const Mat& k, const Mat& v, const ModelConfig& c, std::vector<double>* deviation) {
  const int d = c.head_dim, G = c.n_q_heads / c.n_kv_heads;
  const bool per_query_head = static_cast<int>(entries.size()) == c.n_q_heads && c.n_q_heads != c.n_kv_heads;
  for (std::size_t e = 0; e < entries.size(); ++e) {
    KvEntry& entry = entries[e];
    entry.packed.reset();  // an encoded form no longer stands for the rows
    const int head = per_query_head ? static_cast<int>(e) / G : static_cast<int>(e);
    const bool first_copy = !per_query_head || static_cast<int>(e) % G == 0;  // count each KV head once
    for (std::size_t i = 0; i < batch.rows.size(); ++i) {
      const auto r = static_cast<std::size_t>(batch.rows[i]);
      float* kc = entry.k.data() + at[e][r] * d;
      float* vc = entry.v.data() + at[e][r] * d;
      const float* kn = k.row(static_cast<Eigen::Index>(i)).data() + static_cast<std::ptrdiff_t>(head) * d;
      const float* vn = v.row(static_cast<Eigen::Index>(i)).data() + static_cast<std::ptrdiff_t>(head) * d;
      if (deviation && first_copy)
        for (int j = 0; j < d; ++j) {
          const double dk = static_cast<double>(kn[j]) - kc[j], dv = static_cast<double>(vn[j]) - vc[j];
          (*deviation)[r] += dk * dk + dv * dv;
        }
      std::copy(kn, kn + d, kc);
      std::copy(vn, vn + d, vc);
    }
  }
}

void check_selection(const std::vector<std::int64_t>& sel, std::size_t n) {
  for (std::size_t i = 0; i < sel.size(); ++i)
    if (sel[i] < 0 || sel[i] >= static_cast<std::int64_t>(n) || (i > 0 && sel[i] <= sel[i - 1]))
      throw Error("refresh: selected row " + std::to_string(sel[i]) + " at " + std::to_string(i) +
                  "; expected increasing rows in [0, " + std::to_string(n) + ")");
}

}  // namespace

RefreshResult LlamaModel::refresh(std::span<const std::int32_t> tokens, std::span<const std::int32_t> positions,
                                  std::span<const std::int64_t> indices, const RefreshOptions& o) {
  const ModelConfig& c = cfg_;
  const std::size_t n = tokens.size();
  if (positions.size() != n || indices.size() != n)
    throw Error("refresh: tokens, positions and indices differ in length");
  for (std::size_t i = 0; i < n; ++i)
    if (indices[i] < 0 || indices[i] >= impl_->cache.seen || (i > 0 && indices[i] <= indices[i - 1]))
      throw Error("refresh: token index " + std::to_string(indices[i]) + "; expected increasing indices below " +
                  std::to_string(impl_->cache.seen));
  auto ranges = o.batches;
  if (ranges.empty()) ranges.emplace_back(0, static_cast<std::int64_t>(n));
  for (std::size_t b = 0; b < ranges.size(); ++b)
    if (ranges[b].first != (b ? ranges[b - 1].second : 0) || ranges[b].second <= ranges[b].first ||
        (b + 1 == ranges.size() && ranges[b].second != static_cast<std::int64_t>(n)))
      throw Error("refresh: batches must cover the rows [0, " + std::to_string(n) + ") in order");
  std::vector<std::vector<std::vector<std::int64_t>>> at(static_cast<std::size_t>(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l)  // every row found before anything changes
    for (const KvEntry& e : impl_->cache.layers[static_cast<std::size_t>(l)])
      at[static_cast<std::size_t>(l)].push_back(rows_of(e, indices, l));
  RefreshResult result;
  result.deviation.assign(n, 0.0);
  std::vector<std::int64_t> active(n);
  for (std::size_t i = 0; i < n; ++i) active[i] = static_cast<std::int64_t>(i);
  Mat x = layer_ops::embed(c, impl_->embd, tokens);
  for (int l = 0; l < c.n_layers; ++l) {
    const layer_ops::Layer& L = impl_->layers[static_cast<std::size_t>(l)];
    auto& entries = impl_->cache.layers[static_cast<std::size_t>(l)];
    const bool selecting = l == o.select_layer;
    std::vector<std::pair<Batch, Mat>> queries;  // at the selecting layer: every batch's Q, attended after
    for (Batch& batch : split(ranges, active)) {
      Mat xb = gather(x, batch.rows);
      const layer_ops::Qkv a = layer_ops::project_qkv(c, L, l, xb, pick(positions, batch.rows));
      replace_rows(entries, at[static_cast<std::size_t>(l)], batch, a.k, a.v, c,
                   selecting ? &result.deviation : nullptr);
      if (selecting) {
        queries.emplace_back(std::move(batch), a.q);
        continue;
      }
      layer_ops::finish_layer(c, L, xb, layer_ops::attend(c, l, entries, a.q, pick(indices, batch.rows), nullptr));
      for (std::size_t i = 0; i < batch.rows.size(); ++i) x.row(batch.rows[i]) = xb.row(static_cast<Eigen::Index>(i));
    }
    if (!selecting) continue;
    if (o.select) {
      active = o.select(result.deviation);
      check_selection(active, n);
    }
    for (auto& [batch, q] : queries) {
      std::vector<std::int64_t> keep;  // the batch's selected rows, and their places in it
      Batch chosen;
      for (std::size_t i = 0; i < batch.rows.size(); ++i)
        if (std::binary_search(active.begin(), active.end(), batch.rows[i])) {
          keep.push_back(static_cast<std::int64_t>(i));
          chosen.rows.push_back(batch.rows[i]);
        }
      if (chosen.rows.empty()) continue;
      Mat xb = gather(x, chosen.rows);
      const Mat qb = gather(q, keep);
      layer_ops::finish_layer(c, L, xb, layer_ops::attend(c, l, entries, qb, pick(indices, chosen.rows), nullptr));
      for (std::size_t i = 0; i < chosen.rows.size(); ++i) x.row(chosen.rows[i]) = xb.row(static_cast<Eigen::Index>(i));
    }
  }
  result.selected = active;
  return result;
}

}  // namespace kvsim
