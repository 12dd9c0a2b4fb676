#pragma once
// Low-rank bases fitted once on calibration traces and reused (methods.md §10.b: "from
// calibration"): one (keys, values) basis pair per (layer, KV head), in a small binary file that
// records the geometry it fits. `kvsim trace fit-basis` writes it; lowrank/varrate read it with
// basis=FILE.
#include <cstdint>
#include <string>
#include <vector>

#include "policies/lowrank.h"

namespace kvsim {

struct BasisSet {
  int n_layers = 0, n_kv_heads = 0, head_dim = 0;
  RopeSpec rope;
  std::int64_t tokens = 0;       // calibration tokens per (layer, KV head)
  std::string source;            // what it was fitted on (trace files, model)
  std::vector<HeadBasis> heads;  // [layer * n_kv_heads + kv]
  // Requests the set's bytes are amortised over (the policies' `serves`; not stored in the file).
  double serves = 1;
  const HeadBasis& at(int layer, int kv) const;
};

// Writes to a temporary name and renames, so a failed write leaves no half file.
void save_basis_set(const BasisSet& set, const std::string& path);
// Errors name the file and what is wrong (not a basis file, truncated, bad field).
BasisSet load_basis_set(const std::string& path);
// Throws naming the field when the set was fitted for another geometry or RoPE.
void check_basis_set(const BasisSet& set, const ModelGeometry& g);

}  // namespace kvsim
