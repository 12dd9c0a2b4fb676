#pragma once
// The engine's KV cache as kvcache/'s RowSink: every change the plan API makes to a layer's
// index is mirrored onto the engine's rows (and onto the device, through Engine::evict and a
// reload after an edit). Re-encoding reads a host copy of the original fp16 rows when the layer
// keeps one (a tiered policy that re-tiers while decoding).
#include <cstdint>
#include <span>
#include <vector>

#include "kvcache/plan_apply.h"
#include "model/engine.h"

namespace kvsim {

class EngineRows final : public kvcache::RowSink {
 public:
  // `positions` (by token index) must outlive this; `codec` may be null for eviction policies.
  EngineRows(Engine& model, int layer, const ModelGeometry& g, const KvCodec* codec,
             const std::vector<std::int32_t>& positions);
  // Keeps a host copy of the layer's current rows from now on: re-encodings start from it.
  void keep_originals();
  void drop_originals() { originals_.clear(); }
  bool has_originals() const { return !originals_.empty(); }
  const std::vector<KvEntry>& originals() const { return originals_; }  // [entry], when kept
  // The newest row of every entry (a decode step's token) joins the host copy.
  void joined();

  void keep(const std::vector<std::vector<std::int32_t>>& keep) override;
  void evict(int entry, std::span<const std::int32_t> tokens) override;
  void encode(int entry, const HeadPlan& plan) override;
  void bias(int entry, std::vector<float> bias) override;

 private:
  Engine& model_;
  int layer_;
  ModelGeometry g_;
  const KvCodec* codec_;
  const std::vector<std::int32_t>& positions_;
  std::vector<KvEntry> originals_;  // [entry] fp16 rows of the held tokens, or empty
};

// Throws unless the engine's layer holds exactly the tokens the index says (a sink that missed a
// change would leave live and offline apart silently).
void check_mirror(const Engine& model, int layer, const kvcache::LayerIndex& index, const std::string& label);

}  // namespace kvsim
