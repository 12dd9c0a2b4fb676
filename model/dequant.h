#pragma once
// Dequantization of ggml blocks to f32, one row at a time (formats.md §2). Each output is
// computed in the order ggml and gguf-py use, so results match gguf-py's dequantizers bit for bit.
#include <cstdint>

#include "model/gguf.h"

namespace kvsim {

// Converts `n` elements (a whole number of blocks) starting at `src`. Throws for types without
// a dequantizer (naming the type).
void dequantize_row(GgmlType type, const std::uint8_t* src, float* dst, std::int64_t n);

}  // namespace kvsim
