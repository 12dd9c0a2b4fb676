#include "gpu/packed_unpack.cuh"

#include <cuda_fp16.h>

namespace kvsim::gpu {

namespace {

__device__ float half_bits_to_float(std::uint16_t h) {
  __half_raw raw;
  raw.x = h;
  return __half2float(__half(raw));
}

// One block per row, one thread per channel; low-rank keys are rotated through shared memory
// because RoPE mixes two channels.
__global__ void unpack_kernel(PackedTensorView t, int d, RopeShape rope, const float* __restrict__ rope_cos,
                              const float* __restrict__ rope_sin, std::uint16_t* __restrict__ out) {
  extern __shared__ float x[];
  const PackedRow r = packed_row_at(t.rows, t.positions, blockIdx.x);
  const int i = threadIdx.x;
  float v = 0;
  if (r.kind == PackedKind::Fp16) {
    v = half_bits_to_float(t.halves[r.data + i]);
  } else if (r.kind == PackedKind::Quant) {
    const unsigned u = code_at(t.codes + r.data, i, t.bits);
    const std::int64_t pair = 2 * (r.param + i / t.param_span);
    const float scale = half_bits_to_float(t.params[pair]), mn = half_bits_to_float(t.params[pair + 1]);
    v = t.symmetric ? (static_cast<float>(u) - static_cast<float>((1 << (t.bits - 1)) - 1)) * scale
                    : static_cast<float>(u) * scale + mn;
  } else {
    for (int c = 0; c < r.rank; ++c) v += half_bits_to_float(t.basis[i * d + c]) * half_bits_to_float(t.halves[r.data + c]);
  }
  x[i] = v;
  __syncthreads();
  if (r.kind == PackedKind::LowRank && t.rotate && i < rope.rope_dim / 2) {
    const int a = rope.first(i), b = rope.second(i);
    const std::int64_t at = static_cast<std::int64_t>(r.position) * (rope.rope_dim / 2) + i;
    const float c = rope_cos[at], s = rope_sin[at], xa = x[a], xb = x[b];
    x[a] = xa * c - xb * s;
    x[b] = xa * s + xb * c;
  }
  __syncthreads();
  out[static_cast<std::int64_t>(blockIdx.x) * d + i] = __half_as_ushort(__float2half_rn(x[i]));
}

}  // namespace

cudaError_t unpack_packed(const PackedTensorView& t, int head_dim, const RopeShape& rope, const float* rope_cos,
                          const float* rope_sin, std::uint16_t* out, cudaStream_t stream) {
  if (t.n_rows == 0) return cudaSuccess;
  if (head_dim <= 0 || head_dim > 256) return cudaErrorInvalidValue;
  unpack_kernel<<<static_cast<unsigned>(t.n_rows), head_dim, head_dim * sizeof(float), stream>>>(t, head_dim, rope, rope_cos,
                                                                                                 rope_sin, out);
  return cudaGetLastError();
}

}  // namespace kvsim::gpu
