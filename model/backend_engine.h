#pragma once
// An Engine over a transformer backend (gpu/transformer_backend.h): the CUDA backend for
// --device cuda, or its CPU reference, which stands in for it in tests. The backend holds the
// cache attention reads; a host KvCache mirrors it (each layer's rows arrive through the
// backend's per-layer callback, asynchronously copied on the GPU), so capture reads K/V and
// compression edits entries exactly as on the CPU engine. Handing out the mutable cache marks
// the mirror edited: the next forward() loads it back into the backend. Decode rules run in the
// backend; their evictions come back as rows and leave the mirror too.
#include <memory>
#include <optional>
#include <vector>

#include "model/engine.h"

namespace kvsim {

namespace gpu {
class TransformerBackend;
}

class BackendEngine : public Engine {
 public:
  // Streams `f`'s weights (dequantized per tensor) into `backend`, which must have been made for
  // model_config(f).
  BackendEngine(const GgufFile& f, std::unique_ptr<gpu::TransformerBackend> backend);
  ~BackendEngine() override;
  const ModelConfig& config() const override { return cfg_; }
  std::vector<float> forward(std::span<const std::int32_t> tokens, std::span<const std::int32_t> positions,
                             std::span<const std::int64_t> logit_rows, const LayerHook& hook = {}) override;
  void reset() override;
  void reserve(std::int64_t tokens) override;
  const KvCache& cache() const override { return cache_; }
  KvCache& cache() override;
  void set_cache(KvCache cache) override;
  void evict(int layer, int entry, std::span<const std::int32_t> tokens) override;
  void record_last_attention(bool on) override { record_ = on; }
  std::span<const float> last_attention(int layer, int q_head) const override;
  bool runs_decode_rules() const override { return true; }
  void start_decode_rule(int layer, const DecodeRuleStart& start) override;
  std::vector<std::vector<std::vector<std::int32_t>>> decode_rule_step(std::int64_t budget) override;
  std::string device() const override;
  bool holds_packed() const override { return true; }

 private:
  void load_backend();
  void check_windows() const;
  void end_rules();
  // Rules handed over but not yet in the backend (they start at the next forward(), after the
  // reload an edit asks for), and the layers whose rule the backend runs.
  std::vector<std::optional<DecodeRuleStart>> pending_rules_;
  std::vector<bool> rule_on_;
  ModelConfig cfg_;
  std::unique_ptr<gpu::TransformerBackend> backend_;
  KvCache cache_;
  bool edited_ = false, record_ = false;
};

}  // namespace kvsim
