#pragma once
// Reads a packed cache tensor (core/packed_kv.h) back into fp16 rows on the device: the step by
// which a backend holding packed entries gives attention a layer's rows. Its CPU reference is
// core/packed_kv.h's unpack_tensor; kvsim-parity compares the two.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/packed_kv.h"
#include "gpu/kv_format.h"
#include "gpu/packed_rows.h"

namespace kvsim::gpu {

// out [n_rows, head_dim] fp16 bits. Rotated low-rank rows use the RoPE tables cos/sin
// [positions, rope.rope_dim / 2] (covering every row's position). head_dim <= 256.
cudaError_t unpack_packed(const PackedTensorView& t, int head_dim, const RopeShape& rope, const float* rope_cos,
                          const float* rope_sin, std::uint16_t* out, cudaStream_t stream);

}  // namespace kvsim::gpu
