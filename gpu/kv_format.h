#pragma once
// Shapes and storage formats the attention kernels and their CPU references share: fp16 caches as
// raw half bits [n_kv_heads, capacity, head_dim], intN rows as policies/quantize.cpp's
// int_roundtrip stores them (bit layout: docs/gpu.md, "Formats and rules the device shares").
// Compiles under nvcc and the host compiler alike; no CUDA types.
#include <cstdint>

#if defined(__CUDACC__)
#define KVSIM_HD __host__ __device__ inline
#else
#define KVSIM_HD inline
#endif

namespace kvsim::gpu {

struct AttnShape {
  int n_q_heads = 0, n_kv_heads = 0, head_dim = 0;
  std::int64_t capacity = 0;  // rows per KV head in the cache buffers
  KVSIM_HD int group() const { return n_q_heads / n_kv_heads; }
};

struct QuantSpec {
  int bits = 4;    // 2, 4 or 8
  int group = 32;  // channels per (scale, min) pair; divides head_dim
  bool symmetric = false;
  KVSIM_HD int row_bytes(int head_dim) const { return head_dim * bits / 8; }
  KVSIM_HD int groups(int head_dim) const { return head_dim / group; }
};

// The code of value i in a packed row.
KVSIM_HD unsigned code_at(const std::uint8_t* row, int i, int bits) {
  const int bit = i * bits;
  return (static_cast<unsigned>(row[bit >> 3]) >> (bit & 7)) & ((1u << bits) - 1u);
}

// Dequantizes one value from its code and its group's (scale, min) (floats of the fp16 pair).
KVSIM_HD float dequant(unsigned u, float scale, float mn, const QuantSpec& s) {
  if (s.symmetric) return (static_cast<float>(u) - static_cast<float>((1 << (s.bits - 1)) - 1)) * scale;
  return static_cast<float>(u) * scale + mn;
}

// Low-rank cache (methods.md §10.b/§11, policies/lowrank.h): per KV head fp16 bases Uk, Uv
// [head_dim, head_dim] row-major (column r = the r-th principal direction; keys' basis is of
// pre-RoPE keys) and per token fp16 coefficients [head_dim] of which the first rank[j] count;
// k^_j = RoPE(pos_j, Uk c_j), v^_j = Uv c'_j. RoPE angles come as tables cos/sin
// [positions, rope_dim / 2] (core/rope.h's values); pair i rotates dims rope_pair_first/second.
struct RopeShape {
  bool neox = false;  // pairs (i, i + rope_dim/2) instead of (2i, 2i + 1)
  int rope_dim = 0;
  KVSIM_HD int first(int i) const { return neox ? i : 2 * i; }
  KVSIM_HD int second(int i) const { return neox ? i + rope_dim / 2 : 2 * i + 1; }
};

// Orders (protected, score, index) for top-k as one unsigned key, larger = kept first: protected
// tokens first (the most recent of them first), then by score, ties to the more recent token.
KVSIM_HD unsigned long long keep_key(float score, std::uint32_t index, bool is_protected) {
  unsigned bits;
#if defined(__CUDA_ARCH__)
  bits = __float_as_uint(score);
#else
  __builtin_memcpy(&bits, &score, sizeof bits);
#endif
  bits = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);  // monotone in the float order
  if (is_protected) bits = 0;                                  // order among pins: recency only
  return (static_cast<unsigned long long>(is_protected) << 63) | (static_cast<unsigned long long>(bits) << 31) |
         (index & 0x7fffffffu);
}

}  // namespace kvsim::gpu
