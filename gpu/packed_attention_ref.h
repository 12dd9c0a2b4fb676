#pragma once
// CPU references of gpu/packed_attention.cu's fused decode over intN rows (its fp16 and low-rank
// rows are held to attend_kept_ref over what core/packed_kv.h's unpack_tensor reads back): intN
// rows packed and unpacked exactly as policies/quantize.cpp's int_roundtrip quantizes them, and
// attention over them in double precision.
#include <cstdint>

#include "gpu/kv_format.h"

namespace kvsim::gpu {

// Packs n rows of head_dim floats as intN codes + fp16 (scale, min) pairs. codes: [n, row_bytes],
// params: [n, groups, 2].
void pack_int_rows(const QuantSpec& s, int head_dim, const float* rows, std::int64_t n, std::uint8_t* codes,
                   std::uint16_t* params);
// The rows the packed ones read back ([n, head_dim]).
void unpack_int_rows(const QuantSpec& s, int head_dim, const std::uint8_t* codes, const std::uint16_t* params,
                     std::int64_t n, float* rows);

// One decode query per query head over an intN cache (every row [0, counts[kv]) of each KV head,
// dequantized). out: [n_q_heads, head_dim].
void attend_quant_ref(const AttnShape& s, const QuantSpec& spec, const float* q, const std::uint8_t* k_codes,
                      const std::uint16_t* k_params, const std::uint8_t* v_codes, const std::uint16_t* v_params,
                      const std::int32_t* counts, float* out);

}  // namespace kvsim::gpu
