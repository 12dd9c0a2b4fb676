#pragma once
// How the device holds a packed tensor's row table: 12 bytes a row instead of core/packed_kv.h's
// 24-byte PackedRow, and a position only where a row needs one (low-rank keys rotated to their
// position), since the table is overhead on top of what a codec stores. The kernels read rows
// through packed_row_at and decode a row's values through packed_value and rotate_pair, which the
// CPU tests run against every host row and core/packed_kv.h's unpack_tensor. CUDA-free: compiles
// under nvcc and the host compiler alike.
#include <cstdint>
#include <vector>

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#endif

#include "core/half.h"
#include "core/packed_kv.h"
#include "gpu/kv_format.h"

namespace kvsim::gpu {

struct CompactRow {
  std::uint32_t data = 0;   // PackedRow::data
  std::uint32_t param = 0;  // PackedRow::param
  std::uint16_t rank = 0;
  std::uint8_t kind = 0;    // PackedKind
  std::uint8_t pad = 0;
};
static_assert(sizeof(CompactRow) == 12, "the device row table is 12 bytes a row");

// A tensor's rows as the device holds them. positions is empty unless the tensor rotates its
// low-rank rows; then it has one entry per row.
struct CompactRows {
  std::vector<CompactRow> rows;
  std::vector<std::int32_t> positions;
  std::size_t bytes() const { return rows.size() * sizeof(CompactRow) + positions.size() * sizeof(std::int32_t); }
};

// Throws std::invalid_argument when an offset does not fit 32 bits (a tensor of over 4G halves).
CompactRows compact_rows(const PackedTensor& t);

// Row m as a PackedRow (position 0 when the tensor keeps no positions).
KVSIM_HD PackedRow packed_row_at(const CompactRow* rows, const std::int32_t* positions, std::int64_t m) {
  const CompactRow c = rows[m];
  PackedRow r;
  r.kind = static_cast<PackedKind>(c.kind);
  r.rank = c.rank;
  r.position = positions ? positions[m] : 0;
  r.data = c.data;
  r.param = c.param;
  return r;
}

// One PackedTensor's arrays (same layout as the host vectors) with its row table in the compact
// form: device copies for the kernels, host ones in the CPU tests of the same decoding.
struct PackedTensorView {
  const CompactRow* rows = nullptr;
  const std::int32_t* positions = nullptr;  // null unless low-rank rows are rotated
  std::int64_t n_rows = 0;
  const std::uint16_t* halves = nullptr;
  const std::uint8_t* codes = nullptr;
  const std::uint16_t* params = nullptr;
  const std::uint16_t* basis = nullptr;  // [head_dim, head_dim] when a row is low rank
  int bits = 4, param_span = 32;
  bool symmetric = false, rotate = false;
};

KVSIM_HD float half_value(std::uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(h));
#else
  return half_to_float(h);
#endif
}

// x rounded to the nearest fp16 value: what an fp16 cache row holds.
KVSIM_HD float half_round(float x) {
#if defined(__CUDA_ARCH__)
  return __half2float(__float2half_rn(x));
#else
  return half_to_float(float_to_half(x));
#endif
}

// Channel i of row r as rebuilt, before a low-rank key is rotated: the fp16 value, the dequantized
// code, or U[i, :rank] c (unpack_tensor's order of summation).
KVSIM_HD float packed_value(const PackedTensorView& t, const PackedRow& r, int d, int i) {
  if (r.kind == PackedKind::Fp16) return half_value(t.halves[r.data + i]);
  if (r.kind == PackedKind::Quant) {
    const unsigned u = code_at(t.codes + r.data, i, t.bits);
    const std::int64_t pair = 2 * (r.param + i / t.param_span);
    const float scale = half_value(t.params[pair]);
    if (t.symmetric) return (static_cast<float>(u) - static_cast<float>((1 << (t.bits - 1)) - 1)) * scale;
    return static_cast<float>(u) * scale + half_value(t.params[pair + 1]);
  }
  float v = 0;
  for (int c = 0; c < r.rank; ++c) v += half_value(t.basis[static_cast<std::int64_t>(i) * d + c]) * half_value(t.halves[r.data + c]);
  return v;
}

// Whether row r, once rebuilt, is rotated to its position (low-rank keys: their basis is pre-RoPE).
KVSIM_HD bool packed_rotated(const PackedTensorView& t, const PackedRow& r) {
  return t.rotate && r.kind == PackedKind::LowRank;
}

// Rotates RoPE pair i (< rope_dim / 2) of the rebuilt row x to `position`; the tables are
// [positions, rope_dim / 2]. Pairs are disjoint, so the pairs of a row may rotate in parallel.
KVSIM_HD void rotate_pair(const RopeShape& rope, const float* cos_t, const float* sin_t, std::int32_t position, int i,
                          float* x) {
  const int a = rope.first(i), b = rope.second(i);
  const std::int64_t at = static_cast<std::int64_t>(position) * (rope.rope_dim / 2) + i;
  const float c = cos_t[at], s = sin_t[at], xa = x[a], xb = x[b];
  x[a] = xa * c - xb * s;
  x[b] = xa * s + xb * c;
}

}  // namespace kvsim::gpu
