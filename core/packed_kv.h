#pragma once
// A cache entry as a really compressed cache stores it: the bytes a codec keeps (fp16 rows, intN
// codes with their fp16 (scale, min) pairs, low-rank coefficients with the basis), not the rows it
// reads back. Codecs pack into it (KvCodec::pack), unpack_tensor here reads it back, the CUDA
// backend's cache holds it; its payload is what the codec's byte count claims. Bit layouts:
// docs/gpu.md, "Formats and rules the device shares".
#include <cstdint>
#include <vector>

#include "core/rope.h"

namespace kvsim {

enum class PackedKind : std::uint8_t { Fp16 = 0, Quant = 1, LowRank = 2 };

struct PackedRow {
  PackedKind kind = PackedKind::Fp16;
  std::uint16_t rank = 0;     // LowRank: coefficients stored
  std::int32_t position = 0;  // the token's RoPE position (LowRank keys are rotated to it)
  std::int64_t data = 0;      // Fp16 / LowRank: first half in `halves`; Quant: first byte in `codes`
  std::int64_t param = 0;     // Quant: first (scale, min) pair in `params`
};

struct PackedTensor {
  int bits = 4, param_span = 32;  // every quantized row of the tensor shares them
  bool symmetric = false;
  bool rotate = false;  // keys: low-rank rows are rebuilt pre-RoPE and rotated
  std::vector<PackedRow> rows;
  std::vector<std::uint16_t> halves;  // fp16 bits: fp16 rows and low-rank coefficients
  std::vector<std::uint8_t> codes;
  std::vector<std::uint16_t> params;  // (scale, min) pairs, fp16 bits, interleaved
  std::vector<std::uint16_t> basis;   // [d, basis_cols] fp16 bits, when a row is LowRank
  int basis_cols = 0;                 // directions stored: the highest rank of a request's own basis
  // Share of the basis bytes this entry pays: 1 for a basis fitted on the request, 1/serves for a
  // calibration basis held once and shared by the requests it serves.
  double basis_charge = 1.0;
};

struct PackedEntry {
  int head_dim = 0;
  PackedTensor k, v;
  std::int64_t rows() const { return static_cast<std::int64_t>(k.rows.size()); }
  // Stored bytes: fp16 rows and coefficients at 2 B, codes, 4 B per asymmetric pair or 2 B per
  // symmetric scale, one rank byte per low-rank token (K and V share it) when their ranks differ
  // (one rank for all is a constant of the entry), and the fp16 bases at their charge.
  double payload_bytes() const;
};

// Appends an fp16 row (head_dim values, rounded) to a tensor.
void pack_fp16_row(PackedTensor& t, const float* x, int head_dim, std::int32_t position);

// Reads every row of `t` back ([rows, head_dim] floats, fp16 values): the reference the device
// unpack kernel is held to. Throws naming the field when the tensor is malformed.
void unpack_tensor(const PackedTensor& t, int head_dim, const RopeSpec& rope, std::vector<float>& out);

// Checks the entry's structure (offsets in range, K and V row counts equal, ranks <= head_dim).
void check_packed(const PackedEntry& e);

}  // namespace kvsim
