#pragma once
// One transformer layer's pieces on the CPU, shared by the engine's forward pass (llama_model.cpp)
// and its cache refresh (cache_refresh.cpp). Internal to model/: it brings in Eigen.
#include <Eigen/Dense>
#include <cstdint>
#include <span>
#include <vector>

#include "core/geometry.h"
#include "model/kv_cache.h"
#include "model/weight_matrix.h"

namespace kvsim::layer_ops {

using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Vec = Eigen::VectorXf;

struct Layer {
  Vec attn_norm, ffn_norm, bq, bk, bv;
  Vec q_norm, k_norm, post_attn_norm, post_ffn_norm;  // gemma3
  WeightMatrix wq, wk, wv, wo, wgate, wup, wdown;
};

Mat rms_norm(const Mat& x, const Vec& w, double eps);  // x / sqrt(mean(x^2) + eps) * w, row by row

// The tokens' embedding rows, scaled as the model scales them; throws for an id out of range.
Mat embed(const ModelConfig& c, const WeightMatrix& embd, std::span<const std::int32_t> tokens);

struct Qkv {
  Mat q, k, v;  // [rows, heads x head_dim]
};
// Layer l's Q, K, V of rows x at `positions`: biases, Q/K norms, RoPE; K and V f16-rounded, as
// the cache holds them.
Qkv project_qkv(const ModelConfig& c, const Layer& L, int l, const Mat& x, std::span<const std::int32_t> positions);

// A forward pass's new rows (K and V rows, token indices from `seen`) join every entry of a
// layer's cache: one per KV head, or one per query head (each holding its group's KV head).
void append_rows(std::vector<KvEntry>& entries, const Mat& k, const Mat& v, std::int64_t seen, int head_dim, int group,
                 bool per_query_head, int layer);

// Attention of query rows q, whose tokens are `row_tokens` (increasing), over layer l's entries:
// row i reads its entry's rows up to its own token (itself included) within the layer's window;
// no row after the last row's token is read, so a cache that holds later tokens gives what a
// forward pass over the rows gives. `last_row` (optional) gets, per query head, the last row's
// weights over the rows read.
Mat attend(const ModelConfig& c, int l, const std::vector<KvEntry>& entries, const Mat& q,
           std::span<const std::int64_t> row_tokens, std::vector<std::vector<float>>* last_row);

// The attention output's projection and the feed-forward block, each added to the residual x.
void finish_layer(const ModelConfig& c, const Layer& L, Mat& x, const Mat& attn_out);

}  // namespace kvsim::layer_ops
