#pragma once
// How the device holds a packed tensor's row table: 12 bytes a row instead of core/packed_kv.h's
// 24-byte PackedRow, and a position only where a row needs one (low-rank keys rotated to their
// position), since the table is overhead on top of what a codec stores. The kernels read rows
// through packed_row_at, which the CPU tests run against every host row. CUDA-free: compiles
// under nvcc and the host compiler alike.
#include <cstdint>
#include <vector>

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

}  // namespace kvsim::gpu
