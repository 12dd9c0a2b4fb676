#pragma once
// How the device holds a packed tensor's row table: runs of rows of one kind whose offsets step by
// a row (one run per intN tensor, per KIVI token group), positions only where a row needs one,
// instead of core/packed_kv.h's 24-byte PackedRow a row. The kernels read rows through
// packed_row_at and decode values through packed_value and rotate_pair, which the CPU tests run
// against every host row and unpack_tensor. CUDA-free: nvcc and the host compiler alike.
#include <cstdint>
#include <vector>

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#endif

#include "core/half.h"
#include "core/packed_kv.h"
#include "gpu/kv_format.h"

namespace kvsim::gpu {

// Rows [first, next run's first) of one kind and rank: row first + i reads data + i * (the row's
// size in its array: head_dim halves, head_dim * bits / 8 code bytes, or rank coefficients) and
// param + i * (head_dim / param_span) when own_params, else param (rows sharing their pairs).
struct RowRun {
  std::uint32_t first = 0;
  std::uint32_t data = 0;
  std::uint32_t param = 0;
  std::uint16_t rank = 0;
  std::uint8_t kind = 0;  // PackedKind
  std::uint8_t own_params = 0;
};
static_assert(sizeof(RowRun) == 16, "a run of the device row table is 16 bytes");

// A tensor's rows as the device holds them. positions is empty unless the tensor rotates its
// low-rank rows; then it has one entry per row.
struct RowTable {
  std::vector<RowRun> runs;
  std::vector<std::int32_t> positions;
  std::size_t bytes() const { return runs.size() * sizeof(RowRun) + positions.size() * sizeof(std::int32_t); }
};

// Throws std::invalid_argument when a tensor has 2^31 rows or more, or an offset does not fit 32
// bits (a tensor of over 4G halves or code bytes), naming the row.
RowTable row_table(const PackedTensor& t, int head_dim);

// One PackedTensor's arrays (same layout as the host vectors) with its row table as runs: device
// copies for the kernels, host ones in the CPU tests of the same decoding.
struct PackedTensorView {
  const RowRun* runs = nullptr;
  int n_runs = 0;
  const std::int32_t* positions = nullptr;  // null unless low-rank rows are rotated
  std::int64_t n_rows = 0;
  const std::uint16_t* halves = nullptr;
  const std::uint8_t* codes = nullptr;
  const std::uint16_t* params = nullptr;
  const std::uint16_t* basis = nullptr;  // [head_dim, basis_cols] when a row is low rank
  int basis_cols = 0;
  int bits = 4, param_span = 32;
  bool symmetric = false, rotate = false;
};

// t's view with its layout (rows, runs, bits, pairs, rotation) and no arrays yet: the caller
// points them at the host's or the device's copies.
inline PackedTensorView layout_view(const PackedTensor& t, const RowTable& table) {
  PackedTensorView v;
  v.n_runs = static_cast<int>(table.runs.size());
  v.n_rows = static_cast<std::int64_t>(t.rows.size());
  v.bits = t.bits;
  v.param_span = t.param_span;
  v.basis_cols = t.basis_cols;
  v.symmetric = t.symmetric;
  v.rotate = t.rotate;
  return v;
}

// The view of a tensor's host arrays through `table` (both must outlive it): how the CPU tests
// run the kernels' row decoding.
inline PackedTensorView host_view(const PackedTensor& t, const RowTable& table) {
  PackedTensorView v = layout_view(t, table);
  v.runs = table.runs.data();
  v.positions = table.positions.empty() ? nullptr : table.positions.data();
  v.halves = t.halves.data();
  v.codes = t.codes.data();
  v.params = t.params.data();
  v.basis = t.basis.data();
  return v;
}

// A row's size in its array: halves (fp16 rows, low-rank coefficients) or code bytes.
KVSIM_HD std::int64_t packed_row_size(PackedKind kind, int rank, int head_dim, int bits) {
  if (kind == PackedKind::Fp16) return head_dim;
  if (kind == PackedKind::Quant) return head_dim * bits / 8;
  return rank;
}

// Row m (< t.n_rows) as a PackedRow, from the run holding it (binary search): kind, rank and
// data always; param only for quantized rows (other rows have none); position only when the
// tensor keeps positions (rotated low-rank rows), else 0.
KVSIM_HD PackedRow packed_row_at(const PackedTensorView& t, int head_dim, std::int64_t m) {
  int lo = 0, hi = t.n_runs - 1;  // the last run whose first row is <= m
  while (lo < hi) {
    const int mid = lo + (hi - lo + 1) / 2;
    if (static_cast<std::int64_t>(t.runs[mid].first) <= m)
      lo = mid;
    else
      hi = mid - 1;
  }
  const RowRun run = t.runs[lo];
  const std::int64_t i = m - run.first;
  PackedRow r;
  r.kind = static_cast<PackedKind>(run.kind);
  r.rank = run.rank;
  r.position = t.positions ? t.positions[m] : 0;
  r.data = run.data + i * packed_row_size(r.kind, run.rank, head_dim, t.bits);
  r.param = run.param + (run.own_params ? i * (head_dim / t.param_span) : 0);
  return r;
}

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
// code, or U[i, :rank] c (unpack_tensor's order of summation). On the host this is unpack_tensor
// to the bit (tested); on the device nvcc contracts the multiply-adds into FMAs, so a value may
// round to the neighbouring fp16 there: the unpack and fused kernels share it and agree with each
// other, and the parity harness holds both to unpack_tensor by NMSE.
KVSIM_HD float packed_value(const PackedTensorView& t, const PackedRow& r, int i) {
  if (r.kind == PackedKind::Fp16) return half_value(t.halves[r.data + i]);
  if (r.kind == PackedKind::Quant) {
    const unsigned u = code_at(t.codes + r.data, i, t.bits);
    const std::int64_t pair = 2 * (r.param + i / t.param_span);
    const float scale = half_value(t.params[pair]);
    if (t.symmetric) return (static_cast<float>(u) - static_cast<float>((1 << (t.bits - 1)) - 1)) * scale;
    return static_cast<float>(u) * scale + half_value(t.params[pair + 1]);
  }
  float v = 0;
  for (int c = 0; c < r.rank; ++c)
    v += half_value(t.basis[static_cast<std::int64_t>(i) * t.basis_cols + c]) * half_value(t.halves[r.data + c]);
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
