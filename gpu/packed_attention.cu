#include "gpu/packed_attention.cuh"

#include "gpu/device_math.cuh"
#include "gpu/split_decode.cuh"

namespace kvsim::gpu {

namespace {

// A decode block's rows of one entry: its packed prefix decoded one row at a time by the whole
// warp (lane i holds channels i + 32 t), then its fp16 rows. `buf` is the warp's shared row,
// through which a rotated low-rank key's RoPE pairs (which straddle lanes) are rotated.
template <int kLanes, int kG>
struct PackedRows {
  static constexpr int d = kLanes * 32;
  PackedEntryView entry;
  const std::uint16_t* K;  // the entry's fp16 rows, row 0 = entry row entry.k.n_rows
  const std::uint16_t* V;
  RopeShape rope;
  const float* cos_t;
  const float* sin_t;
  float* buf;  // [d], this warp's

  __device__ void row(const PackedTensorView& t, const std::uint16_t* fp16, int j, int lane, float (&x)[kLanes]) const {
    if (j >= t.n_rows) {
      const std::uint16_t* r = fp16 + (static_cast<std::int64_t>(j) - t.n_rows) * d;
      for (int k = 0; k < kLanes; ++k) x[k] = from_half(r[lane + 32 * k]);
      return;
    }
    const PackedRow r = packed_row_at(t, d, j);
    for (int k = 0; k < kLanes; ++k) x[k] = packed_value(t, r, lane + 32 * k);
    if (packed_rotated(t, r)) {  // the same for every lane: the row is the warp's
      for (int k = 0; k < kLanes; ++k) buf[lane + 32 * k] = x[k];
      __syncwarp();
      for (int i = lane; i < rope.rope_dim / 2; i += 32) rotate_pair(rope, cos_t, sin_t, r.position, i, buf);
      __syncwarp();
      for (int k = 0; k < kLanes; ++k) x[k] = buf[lane + 32 * k];
      __syncwarp();  // buf is the next row's
    }
    for (int k = 0; k < kLanes; ++k) x[k] = half_round(x[k]);
  }

  // Each key row is rebuilt once and scored for every head of the tile.
  __device__ void tile_scores(int t0, int keys, int lane, int heads, const float* qs, float (&sc)[kG]) const {
    for (int g = 0; g < kG; ++g) sc[g] = -INFINITY;
    for (int jj = 0; jj < keys; ++jj) {
      float x[kLanes];
      row(entry.k, K, t0 + jj, lane, x);
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        if (g >= heads) continue;
        float part = 0.0f;
        for (int k = 0; k < kLanes; ++k) part = fmaf(qs[g * d + lane + 32 * k], x[k], part);
        const float dot = warp_sum(part);
        if (lane == jj) sc[g] = dot;
      }
    }
  }

  __device__ void value(int j, int lane, float (&x)[kLanes]) const { row(entry.v, V, j, lane, x); }
};

template <int kLanes, int kG>
__global__ void packed_decode_kernel(const float* __restrict__ q, int head_div,
                                     const PackedEntryView* __restrict__ entries, RopeShape rope,
                                     const float* __restrict__ rope_cos, const float* __restrict__ rope_sin,
                                     const std::uint16_t* __restrict__ cache_k,
                                     const std::uint16_t* __restrict__ cache_v, std::int64_t capacity, EntryRows seen,
                                     float scale, int chunk, float* __restrict__ scratch, float* __restrict__ logits,
                                     int stride) {
  constexpr int d = kLanes * 32;
  __shared__ float bufs[kDecodeWarps * d];  // a row per warp, for the rotation of low-rank keys
  split_decode<kLanes, kG>(q, scale, head_div, seen, 0, chunk, scratch, logits, stride, [&](int e) {
    const std::int64_t base = static_cast<std::int64_t>(e) * capacity * d;
    return PackedRows<kLanes, kG>{
        entries[e], cache_k + base, cache_v + base, rope, rope_cos, rope_sin, bufs + (threadIdx.x / 32) * d};
  });
}

// Logits -> softmax weights with each head's (max, sum) from combine_decode; zero past its rows.
__global__ void normalize_kernel(float* probs, int stride, int head_div, EntryRows seen, const float* stats) {
  const int h = blockIdx.x, n = seen.rows[h / head_div];
  const float M = stats[2 * h], inv = 1.0f / stats[2 * h + 1];
  float* w = probs + static_cast<std::int64_t>(h) * stride;
  for (int j = threadIdx.x; j < stride; j += blockDim.x) w[j] = j < n ? expf(w[j] - M) * inv : 0.0f;
}

template <int kLanes, int kG>
cudaError_t launch(const float* q, int n_head, int head_div, const PackedEntryView* entries, const RopeShape& rope,
                   const float* rope_cos, const float* rope_sin, const std::uint16_t* ck, const std::uint16_t* cv,
                   std::int64_t capacity, const EntryRows& seen, float scale, float* scratch,
                   std::size_t scratch_floats, void* out, bool half_out, float* probs, int stride, float* stats,
                   cudaStream_t stream) {
  constexpr int d = kLanes * 32;
  if (!decode_heads_fit(n_head, head_div, seen.count)) return cudaErrorInvalidValue;
  const int block_rows = decode_block_rows(n_head, head_div);
  const DecodeSplit sp = decode_split(block_rows, seen);
  if (static_cast<std::size_t>(n_head) * sp.splits * (d + 2) > scratch_floats) return cudaErrorInvalidValue;
  if (probs) {
    for (int e = 0; e < seen.count; ++e)
      if (seen.rows[e] > stride) return cudaErrorInvalidValue;
    if (!stats) return cudaErrorInvalidValue;
  }
  packed_decode_kernel<kLanes, kG><<<dim3(sp.splits, block_rows), kDecodeWarps * 32, 0, stream>>>(
      q, head_div, entries, rope, rope_cos, rope_sin, ck, cv, capacity, seen, scale, sp.chunk, scratch, probs, stride);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  err = combine_decode(scratch, n_head, sp.splits, d, out, half_out, probs ? stats : nullptr, stream);
  if (err != cudaSuccess || !probs) return err;
  normalize_kernel<<<n_head, 256, 0, stream>>>(probs, stride, head_div, seen, stats);
  return cudaGetLastError();
}

}  // namespace

cudaError_t attend_decode_packed(const float* q, int n_head, int head_dim, int head_div, const PackedEntryView* entries,
                                 const RopeShape& rope, const float* rope_cos, const float* rope_sin,
                                 const std::uint16_t* cache_k, const std::uint16_t* cache_v, std::int64_t capacity,
                                 const EntryRows& seen, float scale, float* scratch, std::size_t scratch_floats,
                                 void* out, bool half_out, float* probs, int stride, float* stats,
                                 cudaStream_t stream) {
  switch (head_dim) {
#define KVSIM_PACKED_DECODE(L)                                                                                        \
  with_head_tile(head_div, [&](auto tile) {                                                                           \
    return launch<L, decltype(tile)::value>(q, n_head, head_div, entries, rope, rope_cos, rope_sin, cache_k, cache_v, \
                                            capacity, seen, scale, scratch, scratch_floats, out, half_out, probs,     \
                                            stride, stats, stream);                                                   \
  })
    case 32:
      return KVSIM_PACKED_DECODE(1);
    case 64:
      return KVSIM_PACKED_DECODE(2);
    case 96:
      return KVSIM_PACKED_DECODE(3);
    case 128:
      return KVSIM_PACKED_DECODE(4);
    case 256:
      return KVSIM_PACKED_DECODE(8);
#undef KVSIM_PACKED_DECODE
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace kvsim::gpu
