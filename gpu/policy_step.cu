#include "gpu/policy_step.cuh"

namespace kvsim::gpu {

namespace {

constexpr int kThreads = 256;
constexpr int kMoveRows = 16;  // rows a compaction tile moves through shared memory

// Exclusive prefix sum of one int per thread over the block (Hillis-Steele in shared memory,
// blockDim.x == kThreads); *total gets the block's sum. Every thread must call it.
__device__ int block_exclusive_scan(int x, int* buf, int* total) {
  const int t = threadIdx.x;
  buf[t] = x;
  __syncthreads();
  for (int off = 1; off < kThreads; off <<= 1) {
    const int add = t >= off ? buf[t - off] : 0;
    __syncthreads();
    buf[t] += add;
    __syncthreads();
  }
  const int inclusive = buf[t];
  *total = buf[kThreads - 1];
  __syncthreads();  // buf is reused by the next call
  return inclusive - x;
}

// The lower of two (score, row) candidates: the lower score, on a tie the older (lower) row;
// row < 0 is no candidate.
__device__ __forceinline__ void take_lower(double& v, int& m, double ov, int om) {
  if (om >= 0 && (m < 0 || ov < v || (ov == v && om < m))) v = ov, m = om;
}

// One block per scored entry (one for a layer-wide rule): decode_rule_step_ref, step for step.
__global__ void decode_rule_kernel(RuleStepArgs a) {
  __shared__ int scan[kThreads];
  __shared__ double low_v[kThreads / 32];
  __shared__ int low_m[kThreads / 32];
  const int e = blockIdx.x, t = threadIdx.x, lane = t % 32, warp = t / 32;
  const int n = a.rows.rows[e];
  const DecodeRule& r = a.rule;
  double* sc = a.scores + e * a.score_stride;
  std::uint8_t* gone = a.gone + e * a.work_stride;
  const int h0 = r.layer_wide ? 0 : e * a.heads_per_entry;
  const int nh = r.layer_wide ? a.n_heads : a.heads_per_entry;
  for (int m = t; m < n; m += kThreads) {
    double add = 0.0;  // weights are >= 0, so 0 also starts a max
    for (int h = h0; h < h0 + nh; ++h) {
      const double x = a.weights[h * a.stride + m];
      add = r.combine == HeadCombine::Max ? fmax(add, x) : add + x;
    }
    const double base = r.accumulate && m + 1 < n ? sc[m] : 0.0;  // the new row starts from 0
    sc[m] = base + (r.combine == HeadCombine::Mean ? add / nh : add);
    gone[m] = 0;
  }
  __syncthreads();
  // The lowest-scored unprotected row, one at a time, as the policies evict.
  const std::int64_t candidates = n - r.protect_newest;
  for (std::int64_t excess = n - a.budget; excess > 0; --excess) {
    double v = 0;
    int m_low = -1;
    for (int m = t; m < candidates; m += kThreads)
      if (!gone[m]) take_lower(v, m_low, sc[m], m);
    for (int off = 16; off > 0; off >>= 1) {
      const double ov = __shfl_xor_sync(0xffffffffu, v, off);
      const int om = __shfl_xor_sync(0xffffffffu, m_low, off);
      take_lower(v, m_low, ov, om);
    }
    if (lane == 0) low_v[warp] = v, low_m[warp] = m_low;
    __syncthreads();
    if (t == 0) {
      for (int w = 1; w < kThreads / 32; ++w) take_lower(low_v[0], low_m[0], low_v[w], low_m[w]);
      if (low_m[0] >= 0) gone[low_m[0]] = 1;
    }
    __syncthreads();
    const bool none = low_m[0] < 0;
    __syncthreads();  // low_* are rewritten by the next round
    if (none) break;
  }
  // Kept rows and their scores to the front, in order; evicted rows to the report.
  std::int32_t* kept = a.kept + e * a.work_stride;
  std::int32_t* report = a.report + e * a.report_stride;
  int kept_at = 0, gone_at = 0;
  for (int m0 = 0; m0 < n; m0 += kThreads) {
    const int m = m0 + t;
    const bool in = m < n;
    const bool dropped = in && gone[m];
    const double s = in ? sc[m] : 0.0;  // read before any thread of this tile writes
    int kept_total = 0, gone_total = 0;
    const int kept_pos = block_exclusive_scan(in && !dropped ? 1 : 0, scan, &kept_total);
    const int gone_pos = block_exclusive_scan(dropped ? 1 : 0, scan, &gone_total);
    if (in && !dropped) {
      kept[kept_at + kept_pos] = m;
      if (r.accumulate) sc[kept_at + kept_pos] = s;  // <= m: rows of this tile were read above
    }
    if (dropped) report[1 + gone_at + gone_pos] = m;
    kept_at += kept_total;
    gone_at += gone_total;
  }
  if (t == 0) report[0] = gone_at;
  // A layer-wide rule drops the same rows from every entry.
  if (r.layer_wide) {
    __syncthreads();
    for (int e2 = 1; e2 < a.rows.count; ++e2)
      for (int i = t; i <= gone_at; i += kThreads) a.report[e2 * a.report_stride + i] = report[i];
  }
}

// One block per entry: its kept rows moved to the front, tile by tile in increasing order. A
// tile is read whole before it is written, and it writes rows below its first source row's
// successors: kept[j] >= j, so no tile overwrites a row a later tile still reads.
__global__ void compact_kernel(RuleStepArgs a, std::uint16_t* cache_k, std::uint16_t* cache_v, std::int64_t capacity,
                               int d) {
  __shared__ std::uint16_t tile_k[kMoveRows * 256], tile_v[kMoveRows * 256];
  __shared__ int first;
  const int e = blockIdx.x, t = threadIdx.x;
  const std::int32_t* list = a.kept + (a.rule.layer_wide ? 0 : e * a.work_stride);
  const int n_kept = a.rows.rows[e] - a.report[e * a.report_stride];
  if (t == 0) {  // rows before the first eviction stay: kept[j] == j on a prefix
    int lo = 0, hi = n_kept;
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (list[mid] == mid)
        lo = mid + 1;
      else
        hi = mid;
    }
    first = lo;
  }
  __syncthreads();
  std::uint16_t* k = cache_k + e * capacity * d;
  std::uint16_t* v = cache_v + e * capacity * d;
  for (int j0 = first; j0 < n_kept; j0 += kMoveRows) {
    const int count = min(kMoveRows, n_kept - j0) * d;
    for (int i = t; i < count; i += kThreads) {
      const std::int64_t src = static_cast<std::int64_t>(list[j0 + i / d]) * d + i % d;
      tile_k[i] = k[src];
      tile_v[i] = v[src];
    }
    __syncthreads();
    for (int i = t; i < count; i += kThreads) {
      const std::int64_t dst = static_cast<std::int64_t>(j0) * d + i;
      k[dst] = tile_k[i];
      v[dst] = tile_v[i];
    }
    __syncthreads();
  }
}

}  // namespace

cudaError_t decode_rule_step(const RuleStepArgs& a, cudaStream_t stream) {
  const int scored = a.rule.layer_wide ? 1 : a.rows.count;
  if (a.rows.count < 1 || a.heads_per_entry * a.rows.count != a.n_heads) return cudaErrorInvalidValue;
  decode_rule_kernel<<<scored, kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t compact_kept_rows(const RuleStepArgs& a, std::uint16_t* cache_k, std::uint16_t* cache_v,
                              std::int64_t capacity, int head_dim, cudaStream_t stream) {
  if (head_dim > 256 || a.rows.count < 1) return cudaErrorInvalidValue;
  compact_kernel<<<a.rows.count, kThreads, 0, stream>>>(a, cache_k, cache_v, capacity, head_dim);
  return cudaGetLastError();
}

}  // namespace kvsim::gpu
