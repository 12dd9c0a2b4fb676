#pragma once
// Random packed cache tensors (core/packed_kv.h) for the parity harness and its CPU tests: rows
// cycling fp16 / quantized / low rank (ranks 1..d), as a codec storing a mixed plan would.
#include <cstdint>
#include <random>

#include "core/packed_kv.h"

namespace kvsim::gpu {

// n rows at positions first_position, first_position + 1, ...; quantized rows hold random codes
// with scales in [0.01, 0.2] (and mins in [-1, 0] unless symmetric), low-rank rows Gaussian
// coefficients in a Gaussian basis of scale 0.125, fp16 rows N(0, 1) values.
PackedTensor random_packed(int d, std::int64_t n, int bits, int span, bool symmetric, bool rotate, std::mt19937& rng,
                           std::int32_t first_position = 0);

}  // namespace kvsim::gpu
