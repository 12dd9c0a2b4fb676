#pragma once
// The CPU reference backend (the GPU's stand-in in tests), counting what the engine asks of it:
// layer reloads, in-place compactions, entries that arrive in their packed form, and decode rule steps.
#include <span>

#include "gpu/cuda_transformer_ref.h"

namespace kvsim::test {

class CountingBackend : public gpu::TransformerRef {
 public:
  using TransformerRef::TransformerRef;
  void load_layer(int layer, std::span<const gpu::HostEntry> entries) override {
    ++loads;
    for (const auto& e : entries) packed += e.packed != nullptr;
    TransformerRef::load_layer(layer, entries);
  }
  void keep_rows(int layer, int entry, std::span<const std::int64_t> rows) override {
    ++compactions;
    TransformerRef::keep_rows(layer, entry, rows);
  }
  std::vector<std::vector<std::vector<std::int64_t>>> rule_step(std::int64_t budget) override {
    ++rule_steps;
    return TransformerRef::rule_step(budget);
  }
  int loads = 0, compactions = 0, packed = 0, rule_steps = 0;
};

}  // namespace kvsim::test
