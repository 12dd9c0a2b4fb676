#pragma once
// Random packed cache tensors (core/packed_kv.h) for the parity harness and its CPU tests: rows
// cycling fp16 / quantized / low rank (ranks 1..d), as a codec storing a mixed plan would.
#include <cstdint>
#include <functional>
#include <random>
#include <span>
#include <vector>

#include "core/packed_kv.h"
#include "gpu/transformer_shape.h"

namespace kvsim::gpu {

// n rows at positions first_position, first_position + 1, ...; quantized rows hold random codes
// with scales in [0.01, 0.2] (and mins in [-1, 0] unless symmetric), low-rank rows Gaussian
// coefficients in a Gaussian basis of scale 0.125, fp16 rows N(0, 1) values.
// With param_group > 1, quantized rows share their run of pairs in groups of that many rows
// (KIVI's per-channel keys: one run of head_dim pairs per token group).
PackedTensor random_packed(int d, std::int64_t n, int bits, int span, bool symmetric, bool rotate, std::mt19937& rng,
                           std::int32_t first_position = 0, int param_group = 1);

// One layer of a packed cache as the parity harness loads it into both backends, every shape of
// entry a codec's plans produce: on even layers entry e keeps its first rows - 3 - e rows packed
// (int4 keys with rotated low-rank rows, int2 absmax values) and the last entry, when there are
// several, none; on odd layers every row of every entry is packed (8-bit keys with per-channel
// pairs shared by groups of 6 rows as KIVI's, 4-bit absmax values over the whole head), so no fp16
// row is left. The floats
// of a packed prefix are NaN: a backend that read them instead of the packed form would show it.
struct PackedLayer {
  std::vector<PackedEntry> packs;        // [entry]
  std::vector<char> is_packed;           // [entry]
  std::vector<std::vector<float>> k, v;  // [entry] -> [rows, head_dim]
  std::vector<HostEntry> entries() const;
};

// `rows_of(e, keys)` gives entry e's current rows ([rows, head_dim]), whose tail stays fp16.
PackedLayer random_packed_layer(const ModelConfig& s, int layer, std::int64_t rows,
                                const std::function<std::vector<float>(int, bool)>& rows_of, std::mt19937& rng);

// One layer's cache as the fused decode reads it (gpu/packed_attention.cuh), every entry shape:
// entry 0 packed to its last row, the last entry (of several) fp16 only, the others a packed
// prefix of different lengths (int4 keys with rotated low-rank rows, int2 absmax values) with
// fp16 rows after it. dense_* is every row as fp16, [entries, rows, d] (unpack_tensor's read-back
// of the prefix, then the fp16 rows): what a reference attends over; tail_* the fp16 rows after
// each prefix, [entries, tail, d]: what the decode reads beside the packed tensors.
struct MixedPackedCache {
  std::vector<PackedTensor> keys, values;  // [entry], empty (no rows) where nothing is packed
  std::int64_t tail = 1;                   // fp16 rows per entry the tail buffers hold
  std::vector<std::uint16_t> dense_k, dense_v, tail_k, tail_v;
};
MixedPackedCache random_mixed_cache(int entries, int head_dim, std::int64_t rows, RopeType pairing, std::mt19937& rng);

}  // namespace kvsim::gpu
