#pragma once
// Kernels that attend over a really compressed cache, for live verify on the GPU, and the policy
// statistics kernels that keep a policy step on the device. Every kernel has a CPU reference in
// gpu/attention_ref.h with the same arguments (host pointers there, device pointers here); the
// parity harness (kvsim-parity, gpu.parity) compares them. Formats: gpu/kv_format.h.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "gpu/kv_format.h"

namespace kvsim::gpu {

// One decode query per query head over its KV head's kept tokens (indices into the fp16 cache).
// weights [n_q_heads, max_kept] receives the softmax over the kept tokens (zero past counts); it is
// also the kernel's working buffer, so it is required.
cudaError_t attend_kept(const AttnShape& s, const float* q, const std::uint16_t* k, const std::uint16_t* v,
                        const std::int32_t* kept, const std::int32_t* counts, int max_kept, float* out, float* weights,
                        cudaStream_t stream);

// The same over an intN cache, dequantized in the kernel (rows [0, counts[kv]) of each KV head).
// scratch: [n_q_heads, capacity] floats.
cudaError_t attend_quant(const AttnShape& s, const QuantSpec& spec, const float* q, const std::uint8_t* k_codes,
                         const std::uint16_t* k_params, const std::uint8_t* v_codes, const std::uint16_t* v_params,
                         const std::int32_t* counts, float* out, float* scratch, cudaStream_t stream);

// The same over a low-rank cache (attend_lowrank_ref's arguments); scratch: [n_q_heads, capacity]
// floats. Keys are rebuilt and rotated per token in shared memory; values need only Uv times the
// weighted coefficient sum.
cudaError_t attend_lowrank(const AttnShape& s, const RopeShape& rope, const float* q, const std::uint16_t* ck,
                           const std::uint16_t* cv, const std::int32_t* ranks, const std::uint16_t* uk,
                           const std::uint16_t* uv, const std::int32_t* positions, const float* rope_cos,
                           const float* rope_sin, const std::int32_t* counts, float* out, float* scratch,
                           cudaStream_t stream);

// [heads, rows, n] -> [heads, n] column sums.
cudaError_t column_sums(const float* weights, int heads, int rows, int n, float* sums, cudaStream_t stream);

// Keep-mask of the k best of n per head (protect may be null); top_k_ref's rule. Sorts on the
// device (CUB); temp storage is allocated and freed per call.
cudaError_t top_k(const float* scores, const std::uint8_t* protect, int heads, int n, int k, std::uint8_t* keep,
                  cudaStream_t stream);

}  // namespace kvsim::gpu
