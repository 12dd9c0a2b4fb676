#pragma once
// The CPU reference backend (the GPU's stand-in in tests), counting what the engine asks of it:
// layer reloads, in-place compactions, and entries that arrive in their packed form.
#include <span>

#include "gpu/transformer_ref.h"

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
  int loads = 0, compactions = 0, packed = 0;
};

}  // namespace kvsim::test
