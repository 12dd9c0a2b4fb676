#include "gpu/compressed_attention.cuh"

#include <cub/device/device_segmented_sort.cuh>
#include <cuda_fp16.h>

#include "gpu/device_alloc.h"
#include "gpu/device_math.cuh"

namespace kvsim::gpu {

namespace {

constexpr int kThreads = 128;

__device__ float half_at(const std::uint16_t* p, std::int64_t i) { return from_half(p[i]); }

// Softmax over `n` logits in w (in place), by the whole block.
__device__ void block_softmax(float* w, int n, float* shared) {
  float mx = -INFINITY;
  for (int m = threadIdx.x; m < n; m += blockDim.x) mx = fmaxf(mx, w[m]);
  mx = block_reduce<true>(mx, shared);
  float sum = 0;
  for (int m = threadIdx.x; m < n; m += blockDim.x) sum += (w[m] = __expf(w[m] - mx));
  sum = block_reduce<false>(sum, shared);
  const float inv = 1.0f / sum;
  for (int m = threadIdx.x; m < n; m += blockDim.x) w[m] *= inv;
  __syncthreads();
}

// One block per query head: logits of the kept keys (one thread per key), softmax, then the
// weighted value sum (one thread per channel: a warp reads consecutive channels of one row).
__global__ void attend_kept_kernel(AttnShape s, const float* __restrict__ q, const std::uint16_t* __restrict__ k,
                                   const std::uint16_t* __restrict__ v, const std::int32_t* __restrict__ kept,
                                   const std::int32_t* __restrict__ counts, int max_kept, float* __restrict__ out,
                                   float* __restrict__ weights) {
  extern __shared__ float qs[];  // [head_dim] then reduction slots
  const int h = blockIdx.x, kv = h / s.group(), d = s.head_dim;
  const int n = counts[kv];
  const std::int32_t* idx = kept + static_cast<std::int64_t>(kv) * max_kept;
  const std::int64_t base = static_cast<std::int64_t>(kv) * s.capacity * d;
  float* w = weights + static_cast<std::int64_t>(h) * max_kept;
  const float scale = rsqrtf(static_cast<float>(d));
  for (int x = threadIdx.x; x < d; x += blockDim.x) qs[x] = q[h * d + x] * scale;
  __syncthreads();
  for (int m = threadIdx.x; m < n; m += blockDim.x) {
    const std::int64_t row = base + static_cast<std::int64_t>(idx[m]) * d;
    float dot = 0;
    for (int x = 0; x < d; ++x) dot += qs[x] * half_at(k, row + x);
    w[m] = dot;
  }
  for (int m = n + threadIdx.x; m < max_kept; m += blockDim.x) w[m] = 0;
  __syncthreads();
  block_softmax(w, n, qs + d);
  for (int x = threadIdx.x; x < d; x += blockDim.x) {
    float o = 0;
    for (int m = 0; m < n; ++m) o += w[m] * half_at(v, base + static_cast<std::int64_t>(idx[m]) * d + x);
    out[h * d + x] = o;
  }
}

__device__ float dequant_at(const std::uint8_t* codes, const std::uint16_t* params, std::int64_t row, int i,
                            const QuantSpec& spec, int d) {
  const std::uint16_t* pg = params + (row * spec.groups(d) + i / spec.group) * 2;
  return dequant(code_at(codes + row * spec.row_bytes(d), i, spec.bits), half_at(pg, 0), half_at(pg, 1), spec);
}

__global__ void attend_quant_kernel(AttnShape s, QuantSpec spec, const float* __restrict__ q,
                                    const std::uint8_t* __restrict__ k_codes, const std::uint16_t* __restrict__ k_params,
                                    const std::uint8_t* __restrict__ v_codes, const std::uint16_t* __restrict__ v_params,
                                    const std::int32_t* __restrict__ counts, float* __restrict__ out,
                                    float* __restrict__ scratch) {
  extern __shared__ float qs[];
  const int h = blockIdx.x, kv = h / s.group(), d = s.head_dim;
  const int n = counts[kv];
  const std::int64_t row0 = static_cast<std::int64_t>(kv) * s.capacity;
  float* w = scratch + static_cast<std::int64_t>(h) * s.capacity;
  const float scale = rsqrtf(static_cast<float>(d));
  for (int x = threadIdx.x; x < d; x += blockDim.x) qs[x] = q[h * d + x] * scale;
  __syncthreads();
  for (int m = threadIdx.x; m < n; m += blockDim.x) {
    float dot = 0;
    for (int x = 0; x < d; ++x) dot += qs[x] * dequant_at(k_codes, k_params, row0 + m, x, spec, d);
    w[m] = dot;
  }
  __syncthreads();
  block_softmax(w, n, qs + d);
  for (int x = threadIdx.x; x < d; x += blockDim.x) {
    float o = 0;
    for (int m = 0; m < n; ++m) o += w[m] * dequant_at(v_codes, v_params, row0 + m, x, spec, d);
    out[h * d + x] = o;
  }
}

// One block per query head, blockDim >= head_dim: for each token the block rebuilds the key in
// shared memory (thread x: sum_r c_r Uk[x, r]), rotates its pairs, and reduces the dot product.
__global__ void attend_lowrank_kernel(AttnShape s, RopeShape rope, const float* __restrict__ q,
                                      const std::uint16_t* __restrict__ ck, const std::uint16_t* __restrict__ cv,
                                      const std::int32_t* __restrict__ ranks, const std::uint16_t* __restrict__ uk,
                                      const std::uint16_t* __restrict__ uv, const std::int32_t* __restrict__ positions,
                                      const float* __restrict__ rope_cos, const float* __restrict__ rope_sin,
                                      const std::int32_t* __restrict__ counts, float* __restrict__ out,
                                      float* __restrict__ scratch) {
  extern __shared__ float sm[];  // q [d], key [d], coefficients [d], reduction slots
  const int h = blockIdx.x, kv = h / s.group(), d = s.head_dim, pairs = rope.rope_dim / 2, x = threadIdx.x;
  float *qs = sm, *key = sm + d, *coef = sm + 2 * d, *red = sm + 3 * d;
  const int n = counts[kv];
  const std::int64_t row0 = static_cast<std::int64_t>(kv) * s.capacity;
  const std::uint16_t* U = uk + static_cast<std::int64_t>(kv) * d * d;
  float* w = scratch + static_cast<std::int64_t>(h) * s.capacity;
  if (x < d) qs[x] = q[h * d + x] * rsqrtf(static_cast<float>(d));
  for (int m = 0; m < n; ++m) {
    const std::uint16_t* c = ck + (row0 + m) * d;
    const int r = ranks[row0 + m];
    if (x < d) {
      float acc = 0;
      for (int j = 0; j < r; ++j) acc += half_at(c, j) * half_at(U, static_cast<std::int64_t>(x) * d + j);
      key[x] = acc;
    }
    __syncthreads();
    if (x < pairs) {
      const std::int64_t at = static_cast<std::int64_t>(positions[m]) * pairs + x;
      const float cs = rope_cos[at], sn = rope_sin[at];
      const int a = rope.first(x), b = rope.second(x);
      const float x0 = key[a], x1 = key[b];
      key[a] = x0 * cs - x1 * sn;
      key[b] = x0 * sn + x1 * cs;
    }
    __syncthreads();
    const float dot = block_reduce<false>(x < d ? qs[x] * key[x] : 0.0f, red);
    if (x == 0) w[m] = dot;
  }
  __syncthreads();
  block_softmax(w, n, red);
  if (x < d) {
    float acc = 0;
    for (int m = 0; m < n; ++m)
      if (x < ranks[row0 + m]) acc += w[m] * half_at(cv + (row0 + m) * d, x);
    coef[x] = acc;
  }
  __syncthreads();
  if (x < d) {
    const std::uint16_t* V = uv + static_cast<std::int64_t>(kv) * d * d;
    float o = 0;
    for (int j = 0; j < d; ++j) o += half_at(V, static_cast<std::int64_t>(x) * d + j) * coef[j];
    out[h * d + x] = o;
  }
}

__global__ void column_sums_kernel(const float* __restrict__ weights, int heads, int rows, int n, float* __restrict__ sums) {
  const std::int64_t j = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (j >= static_cast<std::int64_t>(heads) * n) return;
  const std::int64_t h = j / n, col = j % n;
  float s = 0;
  for (int r = 0; r < rows; ++r) s += weights[(h * rows + r) * n + col];
  sums[j] = s;
}

__global__ void keys_kernel(const float* __restrict__ scores, const std::uint8_t* __restrict__ protect, int heads, int n,
                            unsigned long long* __restrict__ keys, std::int32_t* __restrict__ index) {
  const std::int64_t j = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (j >= static_cast<std::int64_t>(heads) * n) return;
  const auto i = static_cast<std::uint32_t>(j % n);
  keys[j] = keep_key(scores[j], i, protect != nullptr && protect[j] != 0);
  index[j] = static_cast<std::int32_t>(i);
}

__global__ void mark_kernel(const std::int32_t* __restrict__ sorted_index, int heads, int n, int k, std::uint8_t* __restrict__ keep) {
  const std::int64_t j = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (j >= static_cast<std::int64_t>(heads) * n) return;
  const std::int64_t h = j / n, rank = j % n;
  if (rank < k) keep[h * n + sorted_index[j]] = 1;
}

__global__ void offsets_kernel(int heads, int n, std::int32_t* offsets) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i <= heads) offsets[i] = i * n;
}

unsigned blocks_for(std::int64_t n) { return static_cast<unsigned>((n + 255) / 256); }

}  // namespace

cudaError_t attend_kept(const AttnShape& s, const float* q, const std::uint16_t* k, const std::uint16_t* v,
                        const std::int32_t* kept, const std::int32_t* counts, int max_kept, float* out, float* weights,
                        cudaStream_t stream) {
  if (!weights) return cudaErrorInvalidValue;  // the kernel's working buffer, not an optional output
  const std::size_t shared = (static_cast<std::size_t>(s.head_dim) + kThreads / 32) * sizeof(float);
  attend_kept_kernel<<<s.n_q_heads, kThreads, shared, stream>>>(s, q, k, v, kept, counts, max_kept, out, weights);
  return cudaGetLastError();
}

cudaError_t attend_quant(const AttnShape& s, const QuantSpec& spec, const float* q, const std::uint8_t* k_codes,
                         const std::uint16_t* k_params, const std::uint8_t* v_codes, const std::uint16_t* v_params,
                         const std::int32_t* counts, float* out, float* scratch, cudaStream_t stream) {
  const std::size_t shared = (static_cast<std::size_t>(s.head_dim) + kThreads / 32) * sizeof(float);
  attend_quant_kernel<<<s.n_q_heads, kThreads, shared, stream>>>(s, spec, q, k_codes, k_params, v_codes, v_params, counts,
                                                                   out, scratch);
  return cudaGetLastError();
}

cudaError_t attend_lowrank(const AttnShape& s, const RopeShape& rope, const float* q, const std::uint16_t* ck,
                           const std::uint16_t* cv, const std::int32_t* ranks, const std::uint16_t* uk,
                           const std::uint16_t* uv, const std::int32_t* positions, const float* rope_cos,
                           const float* rope_sin, const std::int32_t* counts, float* out, float* scratch,
                           cudaStream_t stream) {
  if (s.head_dim > kThreads) return cudaErrorInvalidValue;  // one thread per channel
  const std::size_t shared = (3 * static_cast<std::size_t>(s.head_dim) + kThreads / 32) * sizeof(float);
  attend_lowrank_kernel<<<s.n_q_heads, kThreads, shared, stream>>>(s, rope, q, ck, cv, ranks, uk, uv, positions, rope_cos,
                                                                     rope_sin, counts, out, scratch);
  return cudaGetLastError();
}

cudaError_t column_sums(const float* weights, int heads, int rows, int n, float* sums, cudaStream_t stream) {
  const std::int64_t total = static_cast<std::int64_t>(heads) * n;
  if (total == 0) return cudaSuccess;
  column_sums_kernel<<<blocks_for(total), 256, 0, stream>>>(weights, heads, rows, n, sums);
  return cudaGetLastError();
}

cudaError_t top_k(const float* scores, const std::uint8_t* protect, int heads, int n, int k, std::uint8_t* keep,
                  cudaStream_t stream) {
  const std::int64_t total = static_cast<std::int64_t>(heads) * n;
  if (total == 0) return cudaSuccess;
  unsigned long long *keys = nullptr, *keys_out = nullptr;
  std::int32_t *index = nullptr, *index_out = nullptr, *offsets = nullptr;
  void* temp = nullptr;
  std::size_t temp_bytes = 0;
  cudaError_t err = cudaSuccess;
  auto step = [&](cudaError_t e) {
    if (err == cudaSuccess) err = e;
    return err == cudaSuccess;
  };
  bool pooled[6] = {};
  int allocated = 0;
  auto alloc = [&](auto*& p, std::size_t bytes) {
    return step(device_alloc(reinterpret_cast<void**>(&p), bytes, stream, pooled[allocated++]));
  };
  if (alloc(keys, total * sizeof *keys) && alloc(keys_out, total * sizeof *keys) && alloc(index, total * sizeof *index) &&
      alloc(index_out, total * sizeof *index) && alloc(offsets, (heads + 1) * sizeof *offsets)) {
    keys_kernel<<<blocks_for(total), 256, 0, stream>>>(scores, protect, heads, n, keys, index);
    offsets_kernel<<<blocks_for(heads + 1), 256, 0, stream>>>(heads, n, offsets);
    if (step(cudaGetLastError()) &&
        step(cub::DeviceSegmentedSort::SortPairsDescending(nullptr, temp_bytes, keys, keys_out, index, index_out,
                                                           static_cast<int>(total), heads, offsets, offsets + 1, stream)) &&
        alloc(temp, temp_bytes) &&
        step(cub::DeviceSegmentedSort::SortPairsDescending(temp, temp_bytes, keys, keys_out, index, index_out,
                                                           static_cast<int>(total), heads, offsets, offsets + 1, stream)) &&
        step(cudaMemsetAsync(keep, 0, total, stream))) {
      mark_kernel<<<blocks_for(total), 256, 0, stream>>>(index_out, heads, n, k, keep);
      step(cudaGetLastError());
    }
  }
  // In allocation order, each freed as it was allocated.
  void* const order[6] = {keys, keys_out, index, index_out, offsets, temp};
  for (int i = 0; i < allocated; ++i)
    if (order[i]) device_free(order[i], stream, pooled[i]);
  return err;
}

}  // namespace kvsim::gpu
