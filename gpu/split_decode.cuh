#pragma once
// The body of a split (flash-decoding) decode block, shared by the decode over an fp16 cache
// (transformer_kernels.cu) and over a packed one (packed_attention.cu), which differ only in how
// a tile's keys are scored and a value row is read. Device code only.
#include <cstdint>

#include "gpu/device_math.cuh"
#include "gpu/transformer_kernels.cuh"

namespace kvsim::gpu {

// Block (split, head) of a split decode: the head's keys [split * chunk, ...) of entry
// e = head / head_div. Its kDecodeWarps warps take tiles of 32 keys in turn, each warp with its own
// running softmax state; the warps then merge in shared memory and the block writes (max, sum,
// output[d]) to its slot of scratch ([n_head, splits, d + 2]) for combine_decode. make_rows(e)
// gives the entry's rows, an object with
//   float tile_scores(int t0, int keys, int lane, const float* qs): the (scaled) logit of key
//     t0 + lane in lane `lane` (called by every lane of the warp; keys = keys in the tile, lanes
//     past it must not read past the tile and may return anything);
//   void value(int j, int lane, float (&x)[kLanes]): channels lane + 32 t of value row j.
// With `logits` (or null) each key's logit is also stored at logits[head * stride + j].
template <int kLanes, class MakeRows>
__device__ void split_decode(const float* __restrict__ q, float scale, int head_div, const EntryRows& seen, int chunk,
                             float* __restrict__ scratch, float* __restrict__ logits, int stride, const MakeRows& make_rows) {
  constexpr int d = kLanes * 32;
  __shared__ float qs[d];
  __shared__ float wm[kDecodeWarps], wl[kDecodeWarps];
  __shared__ float wo[kDecodeWarps * d];
  const int split = blockIdx.x, splits = gridDim.x, h = blockIdx.y, e = h / head_div;
  const int begin = split * chunk, stop = min(seen.rows[e], begin + chunk);
  for (int c = threadIdx.x; c < d; c += blockDim.x) qs[c] = q[static_cast<std::int64_t>(h) * d + c] * scale;
  __syncthreads();
  const auto rows = make_rows(e);
  float* head_logits = logits ? logits + static_cast<std::int64_t>(h) * stride : nullptr;
  float* dst = scratch + (static_cast<std::int64_t>(h) * splits + split) * (d + 2);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float m = -INFINITY, l = 0.0f, o[kLanes];
  for (int t = 0; t < kLanes; ++t) o[t] = 0.0f;
  for (int t0 = begin + warp * 32; t0 < stop; t0 += kDecodeWarps * 32) {
    const int keys = min(32, stop - t0);
    const float raw = rows.tile_scores(t0, keys, lane, qs);  // every lane: a packed tile is scored warp-wide
    const float sc = lane < keys ? raw : -INFINITY;
    if (head_logits && lane < keys) head_logits[t0 + lane] = sc;
    const float m_new = fmaxf(m, warp_max(sc));  // finite: key t0 < stop is lane 0's
    const float corr = expf(m - m_new);
    const float p = lane < keys ? expf(sc - m_new) : 0.0f;
    l = l * corr + warp_sum(p);
    for (int t = 0; t < kLanes; ++t) o[t] *= corr;
    for (int jj = 0; jj < keys; ++jj) {
      const float pw = __shfl_sync(0xffffffffu, p, jj);
      float x[kLanes];
      rows.value(t0 + jj, lane, x);
      for (int t = 0; t < kLanes; ++t) o[t] = fmaf(pw, x[t], o[t]);
    }
    m = m_new;
  }
  if (lane == 0) wm[warp] = m, wl[warp] = l;
  for (int t = 0; t < kLanes; ++t) wo[warp * d + lane + 32 * t] = o[t];
  __syncthreads();
  // A warp (or the whole split) without keys has max -inf: it adds nothing.
  float M = -INFINITY;
  for (int w = 0; w < kDecodeWarps; ++w) M = fmaxf(M, wm[w]);
  for (int c = threadIdx.x; c < d; c += blockDim.x) {
    float acc = 0.0f;
    for (int w = 0; w < kDecodeWarps; ++w)
      if (wm[w] > -INFINITY) acc += wo[w * d + c] * expf(wm[w] - M);
    dst[2 + c] = acc;
  }
  if (threadIdx.x == 0) {
    float L = 0.0f;
    for (int w = 0; w < kDecodeWarps; ++w)
      if (wm[w] > -INFINITY) L += wl[w] * expf(wm[w] - M);
    dst[0] = M;
    dst[1] = L;
  }
}

}  // namespace kvsim::gpu
