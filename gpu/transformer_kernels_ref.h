#pragma once
// CPU references of the attention kernels in gpu/transformer_kernels.cu (attend_rows,
// attend_decode, last_row_weights) and the fp16 case of gpu/packed_attention.cu: plain loops in
// double precision over fp16 rows, the ground truth the emulated tests and the parity harness
// compare the device against. Arrays are host memory in the layouts of gpu/kv_format.h.
#include <cstdint>
#include <vector>

#include "gpu/kv_format.h"

namespace kvsim::gpu {

// Attention of each query head of KV head kv over that head's n keys and values, both [n, d]
// doubles: what every reference does once it has gathered or rebuilt a KV head's rows (once, not
// once per query head: the Mistral-7B shapes have 32768 rows). With `weights` (or null), each
// head's softmax is written at weights[h * stride], zero from n to stride.
void attend_rows_ref(const AttnShape& s, int kv, const float* q, const std::vector<double>& keys,
                     const std::vector<double>& values, std::int64_t n, float* out, float* weights = nullptr,
                     std::int64_t stride = 0);

// One decode query per query head over its KV head's kept tokens: kept[kv * max_kept + m] for
// m < counts[kv], indices into the fp16 cache. out: [n_q_heads, head_dim]; weights (the softmax
// over the kept tokens, what decode-time policies accumulate): [n_q_heads, max_kept].
void attend_kept_ref(const AttnShape& s, const float* q, const std::uint16_t* k, const std::uint16_t* v,
                     const std::int32_t* kept, const std::int32_t* counts, int max_kept, float* out, float* weights);

// attend_kept_ref's index lists keeping every row [0, n) of each of kv_heads heads.
std::vector<std::int32_t> every_row_kept(int kv_heads, int n);

}  // namespace kvsim::gpu
