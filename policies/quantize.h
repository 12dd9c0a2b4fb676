#pragma once
// Integer quantization of K/V rows as the quantized-tier methods store them (methods.md §12):
// per-token intN over groups of channels (symmetric absmax or asymmetric min-max), and KIVI
// (keys per channel over groups of tokens, values per token over groups of channels, with an
// fp16 residual window). Scales and minimums are stored in fp16, so reconstruction uses their
// fp16-rounded values, and byte counts include them.
#include <cstdint>
#include <span>

namespace kvsim {

struct PackedTensor;  // core/packed_kv.h
struct PackedEntry;

struct IntSpec {
  int bits = 4;            // 2, 4 or 8
  int group = 32;          // channels per (scale[, min]) group; divides head_dim (wider: one group per row)
  bool symmetric = false;  // absmax, 2 B per group; else min-max, 4 B per group
};

// Throws naming the field when bits is not 2/4/8 or group does not divide head_dim.
void check_int_spec(const IntSpec& s, int head_dim);
// Bytes of one quantized row of head_dim values (one tensor of one token).
double int_row_bytes(const IntSpec& s, int head_dim);
// Quantizes and reconstructs one row in place.
void int_roundtrip(const IntSpec& s, std::span<float> row);
// Quantizes one row as int_roundtrip does and appends what the cache stores (codes and fp16
// pairs, one pair per channel group) to `t`, whose bits / group / symmetry it sets or must match.
void int_pack_row(const IntSpec& s, std::span<const float> row, std::int32_t position, PackedTensor& t);

struct KiviSpec {
  int bits = 2;
  int group = 32;     // tokens per key group, channels per value group (capped at head_dim)
  int residual = 32;  // R: fp16 window (R % group == 0)
};

void check_kivi_spec(const KiviSpec& s, int head_dim);
// A KIVI cache holding n tokens after prefill: keys in whole blocks of R (R = 0: of G) are
// quantized and the last n mod R stay fp16; values keep the last min(n, R) in fp16 and quantize the rest.
std::int64_t kivi_fp16_keys(const KiviSpec& s, std::int64_t n);
std::int64_t kivi_fp16_values(const KiviSpec& s, std::int64_t n);
// Bytes of n tokens in one (layer, KV head): quantized rows at bits/8 per value plus their fp16
// (scale, min) pairs (keys: one pair per channel per token group; values: per token per channel
// group), fp16 rows at 2 B per value.
double kivi_bytes(const KiviSpec& s, int head_dim, std::int64_t n);
// Reconstructs n tokens' keys and values ([n, head_dim] row-major) in place, as a KIVI cache
// holding them returns them.
void kivi_roundtrip(const KiviSpec& s, int head_dim, std::int64_t n, std::span<float> keys, std::span<float> values);
// The stored form of that cache (kivi_bytes of payload): each key token group shares one run of
// head_dim (scale, min) pairs, value rows have their own per channel group; fp16 rows as above.
void kivi_pack(const KiviSpec& s, int head_dim, std::int64_t n, std::span<const float> keys,
               std::span<const float> values, std::span<const std::int32_t> positions, PackedEntry& out);

}  // namespace kvsim
