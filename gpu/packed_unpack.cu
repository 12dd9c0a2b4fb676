#include "gpu/packed_unpack.cuh"

#include <cuda_fp16.h>

namespace kvsim::gpu {

namespace {

// One block per row, one thread per channel; low-rank keys are rotated through shared memory
// because RoPE mixes two channels.
__global__ void unpack_kernel(PackedTensorView t, int d, RopeShape rope, const float* __restrict__ rope_cos,
                              const float* __restrict__ rope_sin, std::uint16_t* __restrict__ out) {
  extern __shared__ float x[];
  const PackedRow r = packed_row_at(t, d, blockIdx.x);
  const int i = threadIdx.x;
  x[i] = packed_value(t, r, i);
  __syncthreads();
  if (packed_rotated(t, r) && i < rope.rope_dim / 2) rotate_pair(rope, rope_cos, rope_sin, r.position, i, x);
  __syncthreads();
  out[static_cast<std::int64_t>(blockIdx.x) * d + i] = __half_as_ushort(__float2half_rn(x[i]));
}

}  // namespace

cudaError_t unpack_packed(const PackedTensorView& t, int head_dim, const RopeShape& rope, const float* rope_cos,
                          const float* rope_sin, std::uint16_t* out, cudaStream_t stream) {
  if (t.n_rows == 0) return cudaSuccess;
  if (head_dim <= 0 || head_dim > 256) return cudaErrorInvalidValue;
  unpack_kernel<<<static_cast<unsigned>(t.n_rows), head_dim, head_dim * sizeof(float), stream>>>(
      t, head_dim, rope, rope_cos, rope_sin, out);
  return cudaGetLastError();
}

}  // namespace kvsim::gpu
