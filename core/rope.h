#pragma once
// Rotary position embedding (formats.md §3.3). Two pairings exist and mixing them up corrupts
// results silently: NORM rotates adjacent dims (2i, 2i+1) — llama GGUFs, whose Q/K rows were
// permuted at conversion — and NEOX rotates (i, i + rope_dim/2) — Qwen2, Gemma.
#include <cstdint>
#include <vector>

namespace kvsim {

enum class RopeType { Norm, Neox };

struct RopeSpec {
  RopeType type = RopeType::Norm;
  int head_dim = 0;
  int rope_dim = 0;        // rotated dims; dims >= rope_dim pass through
  double theta = 10000.0;  // base frequency
  // Spelled out: nvcc compiles this header as C++17, which has no defaulted comparisons.
  bool operator==(const RopeSpec& o) const {
    return type == o.type && head_dim == o.head_dim && rope_dim == o.rope_dim && theta == o.theta;
  }
};

// Dims of rotary pair i (i < rope_dim/2).
inline int rope_pair_first(const RopeSpec& s, int i) { return s.type == RopeType::Norm ? 2 * i : i; }
inline int rope_pair_second(const RopeSpec& s, int i) {
  return s.type == RopeType::Norm ? 2 * i + 1 : i + s.rope_dim / 2;
}
// Angle per token of pair i: base^(-2i/rope_dim).
double rope_frequency(const RopeSpec& s, int i);

// Rotates n_heads vectors of head_dim floats (contiguous) in place to position `pos`;
// `inverse` undoes it (rotation by -angle), recovering pre-RoPE vectors.
void apply_rope(const RopeSpec& s, float* x, int n_heads, std::int64_t pos, bool inverse = false);

// apply_rope with the cosines and sines of positions [0, n) computed once (bit-identical
// results): for code that rotates many rows at known positions, e.g. low-rank reconstruction.
class RopeTable {
 public:
  explicit RopeTable(const RopeSpec& s) : spec_(s) {}
  const RopeSpec& spec() const { return spec_; }
  void apply(float* x, int n_heads, std::int64_t pos, bool inverse = false);  // grows the table as needed

 private:
  RopeSpec spec_;
  std::int64_t rows_ = 0;
  std::vector<float> cos_, sin_;  // [position][pair]
};

}  // namespace kvsim
