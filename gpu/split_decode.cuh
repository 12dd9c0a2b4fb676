#pragma once
// The body of a split (flash-decoding) decode block, shared by the decode over an fp16 cache
// (transformer_kernels.cu) and over a packed one (packed_attention.cu), which differ only in how
// a tile's keys are scored and a value row is read. Device code only.
#include <cstdint>

#include "gpu/device_math.cuh"
#include "gpu/transformer_kernels.cuh"

namespace kvsim::gpu {

// Query heads a decode block serves: a tile of up to kG heads of one entry's group, so the
// group's heads read (or rebuild) each key and value row once, not once per head.
template <int kG>
struct HeadTile {
  int entry, first, heads;  // query heads [first, first + heads) read entry `entry`
  __device__ static int tiles(int group) { return (group + kG - 1) / kG; }
  __device__ static HeadTile of_block(int group) {
    const int per = tiles(group), t = static_cast<int>(blockIdx.y) % per;
    HeadTile h;
    h.entry = static_cast<int>(blockIdx.y) / per;
    h.first = h.entry * group + t * kG;
    h.heads = min(kG, group - t * kG);
    return h;
  }
};

// Block (split, head tile) of a split decode: keys [lo + split * chunk, ...) of one entry (lo: 0,
// or the first row of a sliding window of `window` rows), for the up
// to kG query heads of its group the tile holds (group = query heads per entry: 1 for
// per-query-head entries). Its kDecodeWarps warps take tiles of 32 keys in turn, each warp with
// its own running softmax state per head; the warps then merge in shared memory and the block
// writes each head's (max, sum, output[d]) to its slot of scratch ([n_head, splits, d + 2]) for
// combine_decode. make_rows(entry) gives the entry's rows, an object with
//   void tile_scores(int t0, int keys, int lane, int heads, const float* qs, float (&sc)[kG]):
//     the (scaled) logits of key t0 + lane for heads [0, heads) (queries qs [kG, d]) in lane
//     `lane` (called by every lane of the warp; keys = keys in the tile; lanes past it must not
//     read past the tile and may return anything);
//   void value(int j, int lane, float (&x)[kLanes]): channels lane + 32 t of value row j.
// With `logits` (or null) each key's logit is also stored at logits[head * stride + j].
template <int kLanes, int kG, class MakeRows>
__device__ void split_decode(const float* __restrict__ q, float scale, int group, const EntryRows& seen, int window,
                             int chunk, float* __restrict__ scratch, float* __restrict__ logits, int stride,
                             const MakeRows& make_rows) {
  constexpr int d = kLanes * 32;
  __shared__ float qs[kG * d];
  __shared__ float wm[kDecodeWarps * kG], wl[kDecodeWarps * kG];
  __shared__ float wo[kDecodeWarps * kG * d];
  const HeadTile<kG> tile = HeadTile<kG>::of_block(group);
  const int split = blockIdx.x, splits = gridDim.x;
  const int rows_seen = seen.rows[tile.entry];
  const int lo = window > 0 && rows_seen > window ? rows_seen - window : 0;
  const int begin = lo + split * chunk, stop = min(rows_seen, begin + chunk);
  for (int c = threadIdx.x; c < kG * d; c += blockDim.x)
    qs[c] = c / d < tile.heads ? q[static_cast<std::int64_t>(tile.first) * d + c] * scale : 0.0f;
  __syncthreads();
  const auto rows = make_rows(tile.entry);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Per-head state indexed by compile-time g only (guarded by g < tile.heads), so it stays in
  // registers.
  float m[kG], l[kG], o[kG][kLanes];
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    m[g] = -INFINITY, l[g] = 0.0f;
    for (int t = 0; t < kLanes; ++t) o[g][t] = 0.0f;
  }
  for (int t0 = begin + warp * 32; t0 < stop; t0 += kDecodeWarps * 32) {
    const int keys = min(32, stop - t0);
    float raw[kG];
    rows.tile_scores(t0, keys, lane, tile.heads, qs, raw);  // every lane: a packed tile is scored warp-wide
    float p[kG];
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      p[g] = 0.0f;
      if (g >= tile.heads) continue;
      const float sc = lane < keys ? raw[g] : -INFINITY;
      if (logits && lane < keys) logits[static_cast<std::int64_t>(tile.first + g) * stride + t0 + lane] = sc;
      const float m_new = fmaxf(m[g], warp_max(sc));  // finite: key t0 < stop is lane 0's
      const float corr = expf(m[g] - m_new);
      p[g] = lane < keys ? expf(sc - m_new) : 0.0f;
      l[g] = l[g] * corr + warp_sum(p[g]);
      for (int t = 0; t < kLanes; ++t) o[g][t] *= corr;
      m[g] = m_new;
    }
    for (int jj = 0; jj < keys; ++jj) {
      float x[kLanes];
      rows.value(t0 + jj, lane, x);
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        if (g >= tile.heads) continue;
        const float pw = __shfl_sync(0xffffffffu, p[g], jj);
        for (int t = 0; t < kLanes; ++t) o[g][t] = fmaf(pw, x[t], o[g][t]);
      }
    }
  }
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    if (g >= tile.heads) continue;
    if (lane == 0) wm[warp * kG + g] = m[g], wl[warp * kG + g] = l[g];
    for (int t = 0; t < kLanes; ++t) wo[(warp * kG + g) * d + lane + 32 * t] = o[g][t];
  }
  __syncthreads();
  // A warp (or the whole split) without keys has max -inf: it adds nothing.
  for (int g = 0; g < tile.heads; ++g) {
    float M = -INFINITY;
    for (int w = 0; w < kDecodeWarps; ++w) M = fmaxf(M, wm[w * kG + g]);
    float* dst = scratch + (static_cast<std::int64_t>(tile.first + g) * splits + split) * (d + 2);
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
      float acc = 0.0f;
      for (int w = 0; w < kDecodeWarps; ++w)
        if (wm[w * kG + g] > -INFINITY) acc += wo[(w * kG + g) * d + c] * expf(wm[w * kG + g] - M);
      dst[2 + c] = acc;
    }
    if (threadIdx.x == 0) {
      float L = 0.0f;
      for (int w = 0; w < kDecodeWarps; ++w)
        if (wm[w * kG + g] > -INFINITY) L += wl[w * kG + g] * expf(wm[w * kG + g] - M);
      dst[0] = M;
      dst[1] = L;
    }
  }
}

}  // namespace kvsim::gpu
