#pragma once
// What the GPU transformer backend and its CPU reference agree on, in plain C++ (no CUDA, no
// GGUF): the model's geometry, which weight tensors exist and their shapes, the KV-cache entry
// layout, and synthetic random weights for checking the backend where real ones cannot travel.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/geometry.h"
#include "core/packed_kv.h"
#include "core/rope.h"

namespace kvsim::gpu {

// How the GPU keeps the weights: dequantized once to fp16 (GEMMs on fp16 inputs, fp32
// accumulation) or fp32 (slower, for tight parity with the CPU engine).
enum class DeviceWeights { F16, F32 };
const char* device_weights_name(DeviceWeights w);

// QNorm/KNorm (per head, [head_dim]) and the post-norms exist where the shape has qk_norm /
// post_norms (gemma3).
enum class WeightId {
  TokenEmbd,
  Output,
  OutputNorm,
  AttnNorm,
  FfnNorm,
  Wq,
  Wk,
  Wv,
  Wo,
  Wgate,
  Wup,
  Wdown,
  Bq,
  Bk,
  Bv,
  QNorm,
  KNorm,
  PostAttnNorm,
  PostFfnNorm
};
constexpr int kWeightIds = static_cast<int>(WeightId::PostFfnNorm) + 1;
const char* weight_id_name(WeightId id);
bool is_per_layer(WeightId id);
// [rows, cols] of a weight (vectors: rows = 1), row-major, y = x W^T for matrices.
std::pair<std::int64_t, std::int64_t> weight_shape(const ModelConfig& s, WeightId id);
// Every tensor the shape needs, in load order (layer -1 for global ones).
std::vector<std::pair<WeightId, int>> weight_list(const ModelConfig& s);

// Receives one tensor (f32, row-major, exactly weight_shape's size).
using WeightSink = std::function<void(WeightId, int layer, std::span<const float>)>;

// Deterministic random weights: matrices N(0, 1/cols), norms 1 + N(0, 0.1^2), biases N(0, 0.02^2),
// embeddings N(0, 1) (divided by embd_scale where the shape scales them),
// so activations stay O(1) through any depth and attention is neither flat nor one-hot.
void random_weights(const ModelConfig& s, std::uint64_t seed, const WeightSink& sink);

// One cache entry's rows, host side: k and v [rows, head_dim] (f16-valued floats).
struct HostEntry {
  std::int64_t rows = 0;
  const float* k = nullptr;
  const float* v = nullptr;
  // Optional: the packed form of the first packed->rows() rows (core/packed_kv.h), which a backend
  // then holds instead of those rows. Backends do not read k and v there (the parity harness puts
  // NaN in them to prove it); the backend engine keeps the read-back there for its mirror.
  const PackedEntry* packed = nullptr;
};

// Checks a HostEntry's packed prefix before a backend holds it: well formed (check_packed), the
// model's head_dim, no more rows than the entry. Throws std::invalid_argument naming the entry.
void check_host_packed(const PackedEntry& p, std::int64_t entry_rows, int head_dim, int entry);

// Entry layout rule shared by both backends: a layer holds one entry per KV head, or, after a
// per-query-head plan, one per query head; query head h reads entry h or h / group.
inline bool per_query_head(const ModelConfig& s, int entries) {
  return entries == s.n_q_heads && s.n_q_heads != s.n_kv_heads;
}

// The q.k scale both backends use: the shape's attn_scale, else 1/sqrt(head_dim).
inline float attention_scale(const ModelConfig& s) {
  return s.attn_scale > 0 ? static_cast<float>(s.attn_scale) : 1.0f / std::sqrt(static_cast<float>(s.head_dim));
}
// The RoPE of sliding-window layers where the shape gives them their own base (gemma3).
inline RopeSpec local_rope(const ModelConfig& s) {
  RopeSpec r = s.rope;
  if (s.rope_theta_local > 0) r.theta = s.rope_theta_local;
  return r;
}
// A sliding-window layer (window > 0) masks by row: a query whose entry holds `seen` rows up to
// and including its own sees rows [window_start, seen). That is the model's window of tokens
// while the entry holds the newest tokens without gaps, which the backend engine checks.
inline std::int64_t window_start(std::int64_t window, std::int64_t seen) {
  return window > 0 && seen > window ? seen - window : 0;
}
// Throws std::invalid_argument when `layer` is a sliding-window layer: its entries hold fp16
// rows only (no codec compresses a local layer; the packed decode has no window).
void check_unwindowed(const ModelConfig& s, int layer, int entry);

// What a forward pass hands out per layer for its n new rows, post-RoPE, row-major:
// q [n, n_head, head_dim] (null unless asked for), k and v [n, n_head_kv, head_dim] f16-valued.
struct LayerRows {
  int layer = 0;
  std::int64_t n = 0;
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
};
using LayerCallback = std::function<void(const LayerRows&)>;

// cos/sin of every rotary pair at positions [0, rows): [rows, rope_dim/2], computed as core/rope
// computes them (double angles rounded to float), so both backends rotate with the same numbers.
void rope_tables(const RopeSpec& s, std::int64_t rows, std::vector<float>& cos_t, std::vector<float>& sin_t);

}  // namespace kvsim::gpu
