#pragma once
// The CUDA transformer's own kernels (the GEMMs are cuBLAS's): embedding, RMSNorm (and a post-norm
// added into the residual), bias + q/k norms + RoPE (both pairings) + fp16 rounding of K/V, KV
// append, tiled causal attention with an online softmax (sliding windows too), the last row's
// attention weights, SwiGLU / GeGLU, row gather. Device pointers, asynchronous on
// `stream`. Their CPU reference is the whole forward pass, gpu/cuda_transformer_ref.h; the parity
// harness compares the two. Activations are fp32; `half_out` writes the next GEMM's fp16 input.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace kvsim::gpu {

// Rows each cache entry of a layer holds, passed by value (entries <= kMaxEntries: one per KV
// head, or one per query head after a per-query-head plan).
constexpr int kMaxEntries = 256;
struct EntryRows {
  int count = 0;
  int rows[kMaxEntries] = {};
};

// `entries` entries of `rows` rows each.
inline EntryRows same_rows(int entries, int rows) {
  EntryRows r;
  r.count = entries;
  for (int e = 0; e < entries; ++e) r.rows[e] = rows;
  return r;
}

// x[i, :] = table[tokens[i], :] * scale (fp16 or fp32 table).
cudaError_t embed_rows(const void* table, bool half_table, const std::int32_t* tokens, int n, int n_embd, float scale,
                       float* x, cudaStream_t stream);

// y[i, :] = x[i, :] / rms(x[i, :]) * w.
cudaError_t rms_norm_rows(const float* x, const float* w, int n, int n_embd, float eps, void* y, bool half_out,
                          cudaStream_t stream);

// x[i, :] += y[i, :] / rms(y[i, :]) * w: a block's output through its post-norm into the
// residual stream (gemma3).
cudaError_t rms_norm_add_rows(const float* y, const float* w, int n, int n_embd, float eps, float* x,
                              cudaStream_t stream);

struct QkvShape {
  int n_q_heads = 0, n_kv_heads = 0, head_dim = 0, rope_dim = 0;
  bool neox = false;  // pairs (i, i + rope_dim/2) instead of (2i, 2i+1)
};
// Adds the biases (null: none), scales each head of q and k to unit RMS times q_norm / k_norm
// ([head_dim]; null: no such norm), rotates q and k at `positions` (cos/sin tables [pos,
// rope_dim/2]), rounds k and v to fp16 in place and writes those halves to k_half/v_half
// ([n, n_head_kv, d]).
struct QkvFinish {
  const float *bq = nullptr, *bk = nullptr, *bv = nullptr;
  const float *q_norm = nullptr, *k_norm = nullptr;
  float eps = 0.0f;
};
cudaError_t qkv_finish(const QkvShape& s, int n, float* q, float* k, float* v, const QkvFinish& f,
                       const std::int32_t* positions, const float* cos_t, const float* sin_t, std::uint16_t* k_half,
                       std::uint16_t* v_half, cudaStream_t stream);

// Appends the n new rows to every entry of a layer's cache ([entries, capacity, d] halves):
// entry e takes KV head e / entry_div (entry_div = group for per-query-head entries, else 1).
cudaError_t kv_append(const std::uint16_t* k_half, const std::uint16_t* v_half, int n, int n_head_kv, int head_dim,
                      const EntryRows& past, int entry_div, std::int64_t capacity, std::uint16_t* cache_k,
                      std::uint16_t* cache_v, cudaStream_t stream);

// Causal attention of the n new rows: query head h reads entry h / head_div (head_div = group,
// or 1 for per-query-head entries); row i sees the entry's past rows and new rows 0..i, or with
// window > 0 only the last `window` of those (a sliding-window layer, masked by row:
// gpu/transformer_shape.h's window_start). Tiles of keys pass through shared memory with an
// online softmax: nothing T x T is stored. out [n, n_head, d]. head_dim: a multiple of 32, at
// most 256.
cudaError_t attend_rows(const float* q, int n, int n_head, int head_dim, int head_div, const std::uint16_t* cache_k,
                        const std::uint16_t* cache_v, std::int64_t capacity, const EntryRows& past, int window,
                        float scale, void* out, bool half_out, cudaStream_t stream);

// One new row (decode) as attend_rows computes it, split over the keys so long caches fill the
// device (flash-decoding): blocks of `splits` key ranges per head write partial softmax states to
// `scratch` ([n_head, splits, head_dim + 2] floats, at most scratch_floats), a second kernel
// merges them. `seen` counts the new row (already appended); with window > 0 only each entry's
// last `window` rows are read, and split.
cudaError_t attend_decode(const float* q, int n_head, int head_dim, int head_div, const std::uint16_t* cache_k,
                          const std::uint16_t* cache_v, std::int64_t capacity, const EntryRows& seen, int window,
                          float scale, float* scratch, std::size_t scratch_floats, void* out, bool half_out,
                          cudaStream_t stream);

// How a split decode divides each entry's keys: ranges of `chunk` keys (whole passes of its
// kDecodeWarps warps), about two blocks per SM over all `block_rows` (one per query head, or per
// tile of a group's heads); `splits` ranges cover the longest entry.
constexpr int kDecodeWarps = 4, kMaxDecodeSplits = 256;
struct DecodeSplit {
  int chunk = 0, splits = 0;
};
DecodeSplit decode_split(int block_rows, const EntryRows& seen);
// The rows a split decode reads per entry: all `seen`, or the last `window` of them.
inline EntryRows window_span(const EntryRows& seen, int window) {
  EntryRows r = seen;
  if (window > 0)
    for (int e = 0; e < r.count; ++e) r.rows[e] = r.rows[e] < window ? r.rows[e] : window;
  return r;
}
// Query heads a decode block serves for entries of `group` query heads each: all of a lone head,
// else tiles of four (the kernels are built for these two).
inline int decode_head_tile(int group) { return group == 1 ? 1 : 4; }
// f(std::integral_constant<int, tile>{}) with decode_head_tile(group): how a launcher picks the
// kernel instantiation for a group.
template <class F>
auto with_head_tile(int group, F&& f) {
  return decode_head_tile(group) == 1 ? f(std::integral_constant<int, 1>{}) : f(std::integral_constant<int, 4>{});
}
// Decode blocks per key range: a tile of heads of each entry's group, for n_head heads reading
// entries of head_div heads each.
inline int decode_block_rows(int n_head, int head_div) {
  const int tile = decode_head_tile(head_div);
  return n_head / head_div * ((head_div + tile - 1) / tile);
}
// Whether n_head query heads can read `entries` entries of head_div heads each.
inline bool decode_heads_fit(int n_head, int head_div, int entries) {
  return head_div > 0 && n_head > 0 && n_head % head_div == 0 && n_head / head_div <= entries;
}
// The scratch floats a split decode of n_head heads may need ([n_head, splits, head_dim + 2]).
inline std::size_t decode_scratch_floats(int n_head, int head_dim) {
  return static_cast<std::size_t>(n_head) * kMaxDecodeSplits * static_cast<std::size_t>(head_dim + 2);
}
// A split decode's second kernel: merges the [n_head, splits, head_dim + 2] partial states
// (max, sum, output) into out [n_head, head_dim]; with `stats` (or null) it also writes each
// head's (max, sum) [n_head, 2], by which the split kernel's logits become softmax weights.
cudaError_t combine_decode(const float* scratch, int n_head, int splits, int head_dim, void* out, bool half_out,
                           float* stats, cudaStream_t stream);

// Softmax weights of the last new row (q_last [n_head, d]) over each head's entry (`seen` rows
// incl. itself; with window > 0 its last `window` rows): probs [n_head, stride], zero outside.
cudaError_t last_row_weights(const float* q_last, int n_head, int head_dim, int head_div, const std::uint16_t* cache_k,
                             std::int64_t capacity, const EntryRows& seen, int window, float scale, float* probs,
                             int stride, cudaStream_t stream);

// out = act(gate) * up, count values: SiLU (SwiGLU) or, with gelu, GELU in its tanh form (GeGLU).
cudaError_t gated_act(const float* gate, const float* up, std::int64_t count, bool gelu, void* out, bool half_out,
                      cudaStream_t stream);

// dst[j, :] = src[rows[j], :] for j < n: rows of head_dim halves (an entry compacted on the device).
cudaError_t gather_half_rows(const std::uint16_t* src, const std::int32_t* rows, int n, int head_dim,
                             std::uint16_t* dst, cudaStream_t stream);

// y[j, :] = x[rows[j], :].
cudaError_t gather_rows(const float* x, const std::int64_t* rows, int m, int width, float* y, cudaStream_t stream);

}  // namespace kvsim::gpu
