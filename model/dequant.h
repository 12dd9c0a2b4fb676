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

namespace kvsim {

// The block formats whose every element is s * q + o for an unsigned integer q < 256 and an f32
// scale s and offset o shared by 16 consecutive elements (Q4_0, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K).
// unpack_row_u8 writes those q (n of them), s and o (n / 16 each) so that s * q + o equals
// dequantize_row's value bit for bit (each side one rounding at most); a GEMV then reads 1.5 bytes
// per weight instead of 4 (weight_matrix.cpp).
bool unpacks_to_u8(GgmlType type);
void unpack_row_u8(GgmlType type, const std::uint8_t* src, std::int64_t n, std::uint8_t* q, float* s, float* o);

}  // namespace kvsim
