#pragma once
// CPU references of the compressed-attention and policy-statistics kernels (gpu/
// compressed_attention.cuh): plain loops in double precision, the ground truth the parity harness
// compares the GPU against. Every array is host memory in the layouts of gpu/kv_format.h.
#include <cstdint>
#include <vector>

#include "gpu/kv_format.h"

namespace kvsim::gpu {

// Packs n rows of head_dim floats as intN codes + fp16 (scale, min) pairs, quantizing exactly as
// policies/quantize.cpp's int_roundtrip does. codes: [n, row_bytes], params: [n, groups, 2].
void pack_int_rows(const QuantSpec& s, int head_dim, const float* rows, std::int64_t n, std::uint8_t* codes,
                   std::uint16_t* params);
// The rows the packed ones read back ([n, head_dim]).
void unpack_int_rows(const QuantSpec& s, int head_dim, const std::uint8_t* codes, const std::uint16_t* params,
                     std::int64_t n, float* rows);

// One decode query per query head over its KV head's kept tokens: kept[kv * max_kept + m] for
// m < counts[kv], indices into the fp16 cache. out: [n_q_heads, head_dim]; weights (the softmax
// over the kept tokens, what decode-time policies accumulate): [n_q_heads, max_kept].
void attend_kept_ref(const AttnShape& s, const float* q, const std::uint16_t* k, const std::uint16_t* v,
                     const std::int32_t* kept, const std::int32_t* counts, int max_kept, float* out, float* weights);

// attend_kept_ref's index lists keeping every row [0, n) of each of kv_heads heads.
std::vector<std::int32_t> every_row_kept(int kv_heads, int n);

// The same over an intN cache (every row [0, counts[kv]) of each KV head, dequantized).
void attend_quant_ref(const AttnShape& s, const QuantSpec& spec, const float* q, const std::uint8_t* k_codes,
                      const std::uint16_t* k_params, const std::uint8_t* v_codes, const std::uint16_t* v_params,
                      const std::int32_t* counts, float* out);

// The same over a low-rank cache (every row [0, counts[kv]) of each KV head): keys rebuilt from
// rank[j] coefficients in Uk and rotated to their position, values as Uv times the softmax-
// weighted coefficients. ck, cv: [n_kv_heads, capacity, d] fp16; ranks: [n_kv_heads, capacity];
// uk, uv: [n_kv_heads, d, d] fp16; positions: [capacity]; rope_cos/sin: [max position + 1, rope_dim/2].
void attend_lowrank_ref(const AttnShape& s, const RopeShape& rope, const float* q, const std::uint16_t* ck,
                        const std::uint16_t* cv, const std::int32_t* ranks, const std::uint16_t* uk, const std::uint16_t* uv,
                        const std::int32_t* positions, const float* rope_cos, const float* rope_sin,
                        const std::int32_t* counts, float* out);

// Column sums of rows x n attention weights per head ([heads, rows, n] -> [heads, n]): the
// accumulated attention (H2O) and window votes (SnapKV) policies score with.
void column_sums_ref(const float* weights, int heads, int rows, int n, float* sums);

// Keep-mask of the k best of n scores per head ([heads, n] -> [heads, n] of 0/1): protected
// tokens first (the most recent if more than k), then by score, ties to the more recent token --
// policies/selection.h's top_k_mask rule.
void top_k_ref(const float* scores, const std::uint8_t* protect, int heads, int n, int k, std::uint8_t* keep);

// Normalised mean squared error ||a - b||^2 / ||b||^2 (b the reference); infinite (a failure at
// any limit) when the sizes differ or there is nothing to compare.
double nmse(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace kvsim::gpu
