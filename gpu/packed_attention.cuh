#pragma once
// Decode attention straight over a layer whose entries are held packed (core/packed_kv.h): each
// key and value row is dequantized or rebuilt from its codes or coefficients inside the attention
// kernel, so a decode step reads only what the codec stores and needs no fp16 scratch of the
// layer (the unpack path, gpu/packed_unpack.cuh, writes and re-reads the whole layer in fp16).
// A block serves a tile of up to four query heads of a group (gpu/split_decode.cuh), which share
// each rebuilt row.
// Its references: the unpack path and gpu/cuda_transformer_ref.h; kvsim-parity compares all three.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "gpu/kv_format.h"
#include "gpu/packed_rows.h"
#include "gpu/transformer_kernels.cuh"

namespace kvsim::gpu {

// An entry's packed prefix (k.n_rows == v.n_rows rows; 0 for an entry held in fp16 only).
struct PackedEntryView {
  PackedTensorView k, v;
};

// attend_decode's contract over a layer whose entry e holds entries[e] (device memory, one per
// entry) followed by fp16 rows in cache_k / cache_v ([entries, capacity, d], the new row already
// appended); seen counts every row of an entry. Rows are rounded to fp16 as rebuilt, exactly as
// unpack_packed writes them. With `probs` (or null) it also writes last_row_weights' result:
// each head's softmax over its entry [n_head, stride], zero past the entry's rows; stats is then
// [n_head, 2] floats of scratch. head_dim: a multiple of 32, at most 256.
cudaError_t attend_decode_packed(const float* q, int n_head, int head_dim, int head_div, const PackedEntryView* entries,
                                 const RopeShape& rope, const float* rope_cos, const float* rope_sin,
                                 const std::uint16_t* cache_k, const std::uint16_t* cache_v, std::int64_t capacity,
                                 const EntryRows& seen, float scale, float* scratch, std::size_t scratch_floats,
                                 void* out, bool half_out, float* probs, int stride, float* stats, cudaStream_t stream);

}  // namespace kvsim::gpu
