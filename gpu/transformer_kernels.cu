#include "gpu/transformer_kernels.cuh"

#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

#include "gpu/device_math.cuh"
#include "gpu/split_decode.cuh"

namespace kvsim::gpu {

namespace {

constexpr int kThreads = 256;

unsigned blocks_for(std::int64_t count, int threads = kThreads) {
  return static_cast<unsigned>((count + threads - 1) / threads);
}

__global__ void embed_kernel(const void* table, bool half_table, const std::int32_t* tokens, int n, int e, float scale,
                             float* x) {
  const std::int64_t idx = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<std::int64_t>(n) * e) return;
  const std::int64_t i = idx / e, c = idx % e;
  const std::int64_t src = static_cast<std::int64_t>(tokens[i]) * e + c;
  const float v =
      half_table ? from_half(static_cast<const std::uint16_t*>(table)[src]) : static_cast<const float*>(table)[src];
  x[idx] = scale == 1.0f ? v : v * scale;
}

// 1 / rms of one row of e values, block-wide (every thread gets it).
__device__ float inverse_rms(const float* xr, int e, float eps) {
  __shared__ float shared[kThreads / 32];
  float ss = 0;
  for (int c = threadIdx.x; c < e; c += blockDim.x) ss += xr[c] * xr[c];
  ss = block_reduce<false>(ss, shared);
  return 1.0f / sqrtf(ss / static_cast<float>(e) + eps);
}

__global__ void rms_norm_kernel(const float* x, const float* w, int e, float eps, void* y, bool half_out) {
  const std::int64_t row = blockIdx.x;
  const float* xr = x + row * e;
  const float scale = inverse_rms(xr, e, eps);
  for (int c = threadIdx.x; c < e; c += blockDim.x) store(y, row * e + c, xr[c] * scale * w[c], half_out);
}

__global__ void rms_norm_add_kernel(const float* y, const float* w, int e, float eps, float* x) {
  const std::int64_t row = blockIdx.x;
  const float* yr = y + row * e;
  const float scale = inverse_rms(yr, e, eps);
  for (int c = threadIdx.x; c < e; c += blockDim.x) x[row * e + c] += yr[c] * scale * w[c];
}

// Each head of a row's q and k scaled to unit RMS times its norm's weights [d], a warp per head
// (the warp reads the head's channels, reduces, then writes them: no other warp touches them).
__device__ void head_norms(const QkvShape& s, float* qi, float* ki, const QkvFinish& f) {
  const int warps = static_cast<int>(blockDim.x) / 32, lane = static_cast<int>(threadIdx.x) % 32, d = s.head_dim;
  for (int h = static_cast<int>(threadIdx.x) / 32; h < s.n_q_heads + s.n_kv_heads; h += warps) {
    const bool is_q = h < s.n_q_heads;
    float* v = is_q ? qi + h * d : ki + (h - s.n_q_heads) * d;
    const float* w = is_q ? f.q_norm : f.k_norm;
    float ss = 0;
    for (int c = lane; c < d; c += 32) ss += v[c] * v[c];
    ss = warp_sum(ss);
    const float scale = 1.0f / sqrtf(ss / static_cast<float>(d) + f.eps);
    for (int c = lane; c < d; c += 32) v[c] = v[c] * scale * w[c];
  }
}

// One block per row: biases, then per-head norms, then the rotation of every (head, pair), then
// K/V rounding.
__global__ void qkv_finish_kernel(QkvShape s, float* q, float* k, float* v, QkvFinish f, const std::int32_t* positions,
                                  const float* cos_t, const float* sin_t, std::uint16_t* k_half,
                                  std::uint16_t* v_half) {
  const std::int64_t i = blockIdx.x;
  const int d = s.head_dim, Q = s.n_q_heads * d, K = s.n_kv_heads * d, pairs = s.rope_dim / 2;
  float* qi = q + i * Q;
  float* ki = k + i * K;
  float* vi = v + i * K;
  if (f.bq) {
    for (int c = threadIdx.x; c < Q; c += blockDim.x) qi[c] += f.bq[c];
    for (int c = threadIdx.x; c < K; c += blockDim.x) ki[c] += f.bk[c], vi[c] += f.bv[c];
    __syncthreads();
  }
  if (f.q_norm) {
    head_norms(s, qi, ki, f);
    __syncthreads();
  }
  const float* cs = cos_t + static_cast<std::int64_t>(positions[i]) * pairs;
  const float* sn = sin_t + static_cast<std::int64_t>(positions[i]) * pairs;
  for (int idx = threadIdx.x; idx < (s.n_q_heads + s.n_kv_heads) * pairs; idx += blockDim.x) {
    const int head = idx / pairs, j = idx % pairs;
    float* row = head < s.n_q_heads ? qi + head * d : ki + (head - s.n_q_heads) * d;
    const int a = s.neox ? j : 2 * j, b = s.neox ? j + pairs : 2 * j + 1;
    const float x0 = row[a], x1 = row[b];
    row[a] = x0 * cs[j] - x1 * sn[j];
    row[b] = x0 * sn[j] + x1 * cs[j];
  }
  __syncthreads();
  for (int c = threadIdx.x; c < K; c += blockDim.x) {
    const std::uint16_t hk = to_half(ki[c]), hv = to_half(vi[c]);
    k_half[i * K + c] = hk;
    v_half[i * K + c] = hv;
    ki[c] = from_half(hk);
    vi[c] = from_half(hv);
  }
}

__global__ void kv_append_kernel(const std::uint16_t* k_half, const std::uint16_t* v_half, int n, int n_head_kv, int d,
                                 EntryRows past, int entry_div, std::int64_t capacity, std::uint16_t* cache_k,
                                 std::uint16_t* cache_v) {
  const std::int64_t idx = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t per_entry = static_cast<std::int64_t>(n) * d;
  if (idx >= per_entry * past.count) return;
  const int e = static_cast<int>(idx / per_entry);
  const std::int64_t i = (idx % per_entry) / d, c = idx % d;
  const std::int64_t src = (i * n_head_kv + e / entry_div) * d + c;
  const std::int64_t dst = (static_cast<std::int64_t>(e) * capacity + past.rows[e] + i) * d + c;
  cache_k[dst] = k_half[src];
  cache_v[dst] = v_half[src];
}

constexpr int kRowsPerBlock = 4;  // warps per block, one query row each
constexpr int kTile = 32;         // keys per shared-memory tile: one per lane

// Each warp walks its row's keys tile by tile: lane j scores key j of the tile against the
// row's query (in shared memory, a broadcast read), the warp folds the tile into its running
// max / sum / output (lanes own d/32 output channels each). K rows are padded by two halves so
// the lanes' reads of 32 different rows fall in 32 different banks.
template <int kLanes>
__global__ void attend_rows_kernel(const float* __restrict__ q, int n, int n_head, int head_div,
                                   const std::uint16_t* __restrict__ cache_k, const std::uint16_t* __restrict__ cache_v,
                                   std::int64_t capacity, EntryRows past, int window, float scale, void* out,
                                   bool half_out) {
  constexpr int d = kLanes * 32, kstride = d + 2;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto* ks = reinterpret_cast<std::uint16_t*>(smem_raw);
  std::uint16_t* vs = ks + kTile * kstride;
  float* qs = reinterpret_cast<float*>(vs + kTile * d);
  const int h = blockIdx.y, e = h / head_div, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int first = blockIdx.x * kRowsPerBlock, i = first + warp;
  const bool active = i < n;
  const int p = past.rows[e];
  const int limit = p + i;                                           // the last key this row sees
  const int block_last = p + min(n - 1, first + kRowsPerBlock - 1);  // the last key any row sees
  // A sliding window: the first key this row sees, and the first any row of the block sees.
  const int lo = window > 0 ? max(0, limit - window + 1) : 0;
  const int block_lo = window > 0 ? max(0, p + first - window + 1) : 0;
  const std::uint16_t* K = cache_k + static_cast<std::int64_t>(e) * capacity * d;
  const std::uint16_t* V = cache_v + static_cast<std::int64_t>(e) * capacity * d;
  float* qw = qs + warp * d;
  if (active)
    for (int c = lane; c < d; c += 32) qw[c] = q[(static_cast<std::int64_t>(i) * n_head + h) * d + c] * scale;
  float m = -INFINITY, l = 0.0f, o[kLanes];
  for (int t = 0; t < kLanes; ++t) o[t] = 0.0f;
  for (int t0 = block_lo; t0 <= block_last; t0 += kTile) {
    const int keys = min(kTile, block_last + 1 - t0);
    __syncthreads();  // the previous tile is consumed (and qw written, first time round)
    for (int idx = threadIdx.x; idx < keys * (d / 2); idx += blockDim.x) {
      const int j = idx / (d / 2), c = 2 * (idx % (d / 2));
      const std::int64_t src = static_cast<std::int64_t>(t0 + j) * d + c;
      *reinterpret_cast<std::uint32_t*>(ks + j * kstride + c) = *reinterpret_cast<const std::uint32_t*>(K + src);
      *reinterpret_cast<std::uint32_t*>(vs + j * d + c) = *reinterpret_cast<const std::uint32_t*>(V + src);
    }
    __syncthreads();
    if (!active || t0 > limit || t0 + keys <= lo) continue;
    float sc = -INFINITY;
    if (lane < keys && t0 + lane <= limit && t0 + lane >= lo) {
      const std::uint16_t* kr = ks + lane * kstride;
      float dot = 0.0f;
#pragma unroll 8
      for (int c = 0; c < d; c += 2) {
        const __half2 k2 = *reinterpret_cast<const __half2*>(kr + c);
        const float2 kf = __half22float2(k2);
        dot = fmaf(qw[c], kf.x, dot);
        dot = fmaf(qw[c + 1], kf.y, dot);
      }
      sc = dot;
    }
    const float m_new = fmaxf(m, warp_max(sc));  // finite: every tile scored holds a key of [lo, limit]
    const float corr = expf(m - m_new);
    const float pj = sc == -INFINITY ? 0.0f : expf(sc - m_new);
    l = l * corr + warp_sum(pj);
    for (int t = 0; t < kLanes; ++t) o[t] *= corr;
    for (int j = 0; j < keys; ++j) {
      const float pw = __shfl_sync(0xffffffffu, pj, j);
      const std::uint16_t* vr = vs + j * d;
      for (int t = 0; t < kLanes; ++t) o[t] = fmaf(pw, from_half(vr[lane + 32 * t]), o[t]);
    }
    m = m_new;
  }
  if (!active) return;
  const float inv = 1.0f / l;
  for (int t = 0; t < kLanes; ++t)
    store(out, (static_cast<std::int64_t>(i) * n_head + h) * d + lane + 32 * t, o[t] * inv, half_out);
}

// A decode block's keys and values straight from an fp16 cache entry: lane j scores key j of
// its tile from global memory, for each of the block's heads.
template <int kLanes, int kG>
struct HalfRows {
  static constexpr int d = kLanes * 32;
  const std::uint16_t* K;
  const std::uint16_t* V;
  __device__ void tile_scores(int t0, int keys, int lane, int heads, const float* qs, float (&sc)[kG]) const {
    for (int g = 0; g < kG; ++g) sc[g] = -INFINITY;
    if (lane >= keys) return;
    const std::uint16_t* kr = K + static_cast<std::int64_t>(t0 + lane) * d;
    float dot[kG] = {};
#pragma unroll 8
    for (int c = 0; c < d; c += 2) {
      const float2 kf = __half22float2(*reinterpret_cast<const __half2*>(kr + c));
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        dot[g] = fmaf(qs[g * d + c], kf.x, dot[g]);
        dot[g] = fmaf(qs[g * d + c + 1], kf.y, dot[g]);
      }
    }
#pragma unroll
    for (int g = 0; g < kG; ++g)
      if (g < heads) sc[g] = dot[g];
  }
  __device__ void value(int j, int lane, float (&x)[kLanes]) const {
    const std::uint16_t* vr = V + static_cast<std::int64_t>(j) * d;
    for (int t = 0; t < kLanes; ++t) x[t] = from_half(vr[lane + 32 * t]);
  }
};

// Block (split, head tile): split_decode over its entry's fp16 rows.
template <int kLanes, int kG>
__global__ void decode_split_kernel(const float* __restrict__ q, int group, const std::uint16_t* __restrict__ cache_k,
                                    const std::uint16_t* __restrict__ cache_v, std::int64_t capacity, EntryRows seen,
                                    int window, float scale, int chunk, float* __restrict__ scratch) {
  split_decode<kLanes, kG>(q, scale, group, seen, window, chunk, scratch, nullptr, 0, [&](int e) {
    const std::int64_t base = static_cast<std::int64_t>(e) * capacity * HalfRows<kLanes, kG>::d;
    return HalfRows<kLanes, kG>{cache_k + base, cache_v + base};
  });
}

__global__ void decode_combine_kernel(const float* __restrict__ scratch, int splits, int d, void* out, bool half_out,
                                      float* stats) {
  const int h = blockIdx.x;
  const float* base = scratch + static_cast<std::int64_t>(h) * splits * (d + 2);
  float M = -INFINITY;
  for (int s = 0; s < splits; ++s) M = fmaxf(M, base[s * (d + 2)]);
  float L = 0.0f;
  for (int s = 0; s < splits; ++s)
    if (base[s * (d + 2)] > -INFINITY) L += base[s * (d + 2) + 1] * expf(base[s * (d + 2)] - M);
  if (stats && threadIdx.x == 0) stats[2 * h] = M, stats[2 * h + 1] = L;
  const float inv = 1.0f / L;
  for (int c = threadIdx.x; c < d; c += blockDim.x) {
    float acc = 0.0f;
    for (int s = 0; s < splits; ++s) {
      const float ms = base[s * (d + 2)];
      if (ms > -INFINITY) acc += base[s * (d + 2) + 2 + c] * expf(ms - M);
    }
    store(out, static_cast<std::int64_t>(h) * d + c, acc * inv, half_out);
  }
}

__global__ void last_row_kernel(const float* q_last, int head_dim, int head_div, const std::uint16_t* cache_k,
                                std::int64_t capacity, EntryRows seen, int window, float scale, float* probs,
                                int stride) {
  extern __shared__ float qshared[];  // [head_dim] then reduction slots
  float* red = qshared + head_dim;
  const int h = blockIdx.x, e = h / head_div, n = seen.rows[e], d = head_dim;
  const int lo = window > 0 && n > window ? n - window : 0;  // a sliding window's first row
  const std::uint16_t* K = cache_k + static_cast<std::int64_t>(e) * capacity * d;
  for (int c = threadIdx.x; c < d; c += blockDim.x) qshared[c] = q_last[static_cast<std::int64_t>(h) * d + c] * scale;
  __syncthreads();
  float* w = probs + static_cast<std::int64_t>(h) * stride;
  float mx = -INFINITY;
  for (int j = lo + static_cast<int>(threadIdx.x); j < n; j += blockDim.x) {
    float dot = 0.0f;
    for (int c = 0; c < d; ++c) dot = fmaf(qshared[c], from_half(K[static_cast<std::int64_t>(j) * d + c]), dot);
    w[j] = dot;
    mx = fmaxf(mx, dot);
  }
  mx = block_reduce<true>(mx, red);
  float sum = 0.0f;
  for (int j = lo + static_cast<int>(threadIdx.x); j < n; j += blockDim.x) sum += (w[j] = expf(w[j] - mx));
  sum = block_reduce<false>(sum, red);
  const float inv = 1.0f / sum;
  for (int j = threadIdx.x; j < stride; j += blockDim.x) w[j] = j >= lo && j < n ? w[j] * inv : 0.0f;
}

__global__ void gated_act_kernel(const float* gate, const float* up, std::int64_t count, bool gelu, void* out,
                                 bool half_out) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const float g = gate[i];
  const float k = 0.7978845608028654f;  // sqrt(2 / pi)
  const float a = gelu ? 0.5f * g * (1.0f + tanhf(k * (g + 0.044715f * g * g * g))) : g / (1.0f + expf(-g));
  store(out, i, a * up[i], half_out);
}

__global__ void gather_half_kernel(const std::uint16_t* src, const std::int32_t* rows, int n, int d,
                                   std::uint16_t* dst) {
  const std::int64_t idx = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<std::int64_t>(n) * d) return;
  dst[idx] = src[static_cast<std::int64_t>(rows[idx / d]) * d + idx % d];
}

__global__ void gather_kernel(const float* x, const std::int64_t* rows, int m, int width, float* y) {
  const std::int64_t idx = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<std::int64_t>(m) * width) return;
  y[idx] = x[rows[idx / width] * width + idx % width];
}

template <int kLanes>
cudaError_t launch_attend(const float* q, int n, int n_head, int head_div, const std::uint16_t* ck,
                          const std::uint16_t* cv, std::int64_t capacity, const EntryRows& past, int window,
                          float scale, void* out, bool half_out, cudaStream_t stream) {
  constexpr int d = kLanes * 32;
  const std::size_t smem = (kTile * (d + 2) + kTile * d) * sizeof(std::uint16_t) + kRowsPerBlock * d * sizeof(float);
  const dim3 grid((n + kRowsPerBlock - 1) / kRowsPerBlock, n_head);
  attend_rows_kernel<kLanes><<<grid, kRowsPerBlock * 32, smem, stream>>>(q, n, n_head, head_div, ck, cv, capacity, past,
                                                                         window, scale, out, half_out);
  return cudaGetLastError();
}

template <int kLanes, int kG>
cudaError_t launch_decode(const float* q, int n_head, int head_div, const std::uint16_t* ck, const std::uint16_t* cv,
                          std::int64_t capacity, const EntryRows& seen, int window, float scale, float* scratch,
                          std::size_t scratch_floats, void* out, bool half_out, cudaStream_t stream) {
  constexpr int d = kLanes * 32;
  if (!decode_heads_fit(n_head, head_div, seen.count)) return cudaErrorInvalidValue;
  const int block_rows = decode_block_rows(n_head, head_div);
  const DecodeSplit sp = decode_split(block_rows, window_span(seen, window));
  if (static_cast<std::size_t>(n_head) * sp.splits * (d + 2) > scratch_floats) return cudaErrorInvalidValue;
  decode_split_kernel<kLanes, kG><<<dim3(sp.splits, block_rows), kDecodeWarps * 32, 0, stream>>>(
      q, head_div, ck, cv, capacity, seen, window, scale, sp.chunk, scratch);
  return combine_decode(scratch, n_head, sp.splits, d, out, half_out, nullptr, stream);
}

}  // namespace

DecodeSplit decode_split(int block_rows, const EntryRows& seen) {
  static const int sms = [] {
    int dev = 0, n = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
    return n > 0 ? n : 1;
  }();
  int most = 1;
  for (int e = 0; e < seen.count; ++e) most = std::max(most, seen.rows[e]);
  // About two blocks per SM over all block rows (heads or head tiles), each at least one pass of
  // its four warps.
  const int want = std::clamp(2 * sms / std::max(block_rows, 1), 1, kMaxDecodeSplits), step = kDecodeWarps * 32;
  DecodeSplit sp;
  sp.chunk = std::max(step, ((most + want - 1) / want + step - 1) / step * step);
  sp.splits = (most + sp.chunk - 1) / sp.chunk;
  return sp;
}

cudaError_t combine_decode(const float* scratch, int n_head, int splits, int head_dim, void* out, bool half_out,
                           float* stats, cudaStream_t stream) {
  decode_combine_kernel<<<n_head, 128, 0, stream>>>(scratch, splits, head_dim, out, half_out, stats);
  return cudaGetLastError();
}

cudaError_t embed_rows(const void* table, bool half_table, const std::int32_t* tokens, int n, int n_embd, float scale,
                       float* x, cudaStream_t stream) {
  const std::int64_t count = static_cast<std::int64_t>(n) * n_embd;
  embed_kernel<<<blocks_for(count), kThreads, 0, stream>>>(table, half_table, tokens, n, n_embd, scale, x);
  return cudaGetLastError();
}

cudaError_t rms_norm_rows(const float* x, const float* w, int n, int n_embd, float eps, void* y, bool half_out,
                          cudaStream_t stream) {
  rms_norm_kernel<<<n, kThreads, 0, stream>>>(x, w, n_embd, eps, y, half_out);
  return cudaGetLastError();
}

cudaError_t rms_norm_add_rows(const float* y, const float* w, int n, int n_embd, float eps, float* x,
                              cudaStream_t stream) {
  rms_norm_add_kernel<<<n, kThreads, 0, stream>>>(y, w, n_embd, eps, x);
  return cudaGetLastError();
}

cudaError_t qkv_finish(const QkvShape& s, int n, float* q, float* k, float* v, const QkvFinish& f,
                       const std::int32_t* positions, const float* cos_t, const float* sin_t, std::uint16_t* k_half,
                       std::uint16_t* v_half, cudaStream_t stream) {
  if ((f.q_norm == nullptr) != (f.k_norm == nullptr) || (f.bq == nullptr) != (f.bk == nullptr) ||
      (f.bq == nullptr) != (f.bv == nullptr))
    return cudaErrorInvalidValue;  // the kernel reads both norms, or all three biases, or none
  qkv_finish_kernel<<<n, kThreads, 0, stream>>>(s, q, k, v, f, positions, cos_t, sin_t, k_half, v_half);
  return cudaGetLastError();
}

cudaError_t kv_append(const std::uint16_t* k_half, const std::uint16_t* v_half, int n, int n_head_kv, int head_dim,
                      const EntryRows& past, int entry_div, std::int64_t capacity, std::uint16_t* cache_k,
                      std::uint16_t* cache_v, cudaStream_t stream) {
  const std::int64_t count = static_cast<std::int64_t>(n) * head_dim * past.count;
  kv_append_kernel<<<blocks_for(count), kThreads, 0, stream>>>(k_half, v_half, n, n_head_kv, head_dim, past, entry_div,
                                                               capacity, cache_k, cache_v);
  return cudaGetLastError();
}

cudaError_t attend_rows(const float* q, int n, int n_head, int head_dim, int head_div, const std::uint16_t* cache_k,
                        const std::uint16_t* cache_v, std::int64_t capacity, const EntryRows& past, int window,
                        float scale, void* out, bool half_out, cudaStream_t stream) {
  switch (head_dim) {
#define KVSIM_ATTEND(L) \
  launch_attend<L>(q, n, n_head, head_div, cache_k, cache_v, capacity, past, window, scale, out, half_out, stream)
    case 32:
      return KVSIM_ATTEND(1);
    case 64:
      return KVSIM_ATTEND(2);
    case 96:
      return KVSIM_ATTEND(3);
    case 128:
      return KVSIM_ATTEND(4);
    case 256:
      return KVSIM_ATTEND(8);
#undef KVSIM_ATTEND
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t attend_decode(const float* q, int n_head, int head_dim, int head_div, const std::uint16_t* cache_k,
                          const std::uint16_t* cache_v, std::int64_t capacity, const EntryRows& seen, int window,
                          float scale, float* scratch, std::size_t scratch_floats, void* out, bool half_out,
                          cudaStream_t stream) {
  switch (head_dim) {
#define KVSIM_DECODE(L)                                                                                           \
  with_head_tile(head_div, [&](auto tile) {                                                                       \
    return launch_decode<L, decltype(tile)::value>(q, n_head, head_div, cache_k, cache_v, capacity, seen, window, \
                                                   scale, scratch, scratch_floats, out, half_out, stream);        \
  })
    case 32:
      return KVSIM_DECODE(1);
    case 64:
      return KVSIM_DECODE(2);
    case 96:
      return KVSIM_DECODE(3);
    case 128:
      return KVSIM_DECODE(4);
    case 256:
      return KVSIM_DECODE(8);
#undef KVSIM_DECODE
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t last_row_weights(const float* q_last, int n_head, int head_dim, int head_div, const std::uint16_t* cache_k,
                             std::int64_t capacity, const EntryRows& seen, int window, float scale, float* probs,
                             int stride, cudaStream_t stream) {
  const std::size_t smem = (static_cast<std::size_t>(head_dim) + kThreads / 32) * sizeof(float);
  last_row_kernel<<<n_head, kThreads, smem, stream>>>(q_last, head_dim, head_div, cache_k, capacity, seen, window,
                                                      scale, probs, stride);
  return cudaGetLastError();
}

cudaError_t gated_act(const float* gate, const float* up, std::int64_t count, bool gelu, void* out, bool half_out,
                      cudaStream_t stream) {
  gated_act_kernel<<<blocks_for(count), kThreads, 0, stream>>>(gate, up, count, gelu, out, half_out);
  return cudaGetLastError();
}

cudaError_t gather_half_rows(const std::uint16_t* src, const std::int32_t* rows, int n, int head_dim,
                             std::uint16_t* dst, cudaStream_t stream) {
  const std::int64_t count = static_cast<std::int64_t>(n) * head_dim;
  if (count == 0) return cudaSuccess;
  gather_half_kernel<<<blocks_for(count), kThreads, 0, stream>>>(src, rows, n, head_dim, dst);
  return cudaGetLastError();
}

cudaError_t gather_rows(const float* x, const std::int64_t* rows, int m, int width, float* y, cudaStream_t stream) {
  const std::int64_t count = static_cast<std::int64_t>(m) * width;
  gather_kernel<<<blocks_for(count), kThreads, 0, stream>>>(x, rows, m, width, y);
  return cudaGetLastError();
}

}  // namespace kvsim::gpu
