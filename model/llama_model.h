#pragma once
// A Llama-family transformer (llama: SmolLM2, Llama, Mistral; qwen2 adds Q/K/V biases and NEOX
// RoPE) evaluated on the CPU in f32 arithmetic: weights kept in their GGUF blocks or dequantized
// at load (weight_matrix.h), Eigen GEMMs, an f16-valued KV cache that compression can edit
// (kv_cache.h), and a per-layer hook that sees the post-RoPE Q/K/V the capture driver records.
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/engine.h"

namespace kvsim {

class LlamaModel : public Engine {
 public:
  // With WeightFormat::Quantized the weights stay in `f`'s mapping: `f` must outlive the model.
  explicit LlamaModel(const GgufFile& f, WeightFormat weights = WeightFormat::Quantized);
  ~LlamaModel() override;
  const ModelConfig& config() const override { return cfg_; }

  std::vector<float> forward(std::span<const std::int32_t> tokens, std::span<const std::int32_t> positions,
                             std::span<const std::int64_t> logit_rows, const LayerHook& hook = {}) override;
  RefreshResult refresh(std::span<const std::int32_t> tokens, std::span<const std::int32_t> positions,
                        std::span<const std::int64_t> indices, const RefreshOptions& options) override;
  void reset() override;
  void reserve(std::int64_t tokens) override;
  const KvCache& cache() const override;
  KvCache& cache() override;
  void set_cache(KvCache cache) override;  // e.g. the state after a shared prefill
  void record_last_attention(bool on) override;
  std::span<const float> last_attention(int layer, int q_head) const override;
  std::string device() const override { return "cpu"; }
  WeightFormat weight_format() const { return weights_; }
  std::size_t weight_heap_bytes() const;  // weights copied to the heap (f32 form)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  ModelConfig cfg_;
  WeightFormat weights_;
};

}  // namespace kvsim
