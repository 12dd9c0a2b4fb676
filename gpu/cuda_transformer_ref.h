#pragma once
// CPU reference of the CUDA transformer backend (gpu/cuda_transformer.h): the same forward pass,
// cache layout and rounding points in plain loops with double accumulation, the ground truth the
// parity harness holds the GPU against. With DeviceWeights::F16 it rounds exactly where the GPU
// path does (weights, every GEMM input, the KV cache), so the two differ only in summation order.
// tests/test_transformer_ref.cpp holds it against the Eigen engine (model/llama_model.h).
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "gpu/transformer_backend.h"

namespace kvsim::gpu {

class TransformerRef : public TransformerBackend {
 public:
  TransformerRef(const ModelConfig& s, DeviceWeights w);
  const ModelConfig& shape() const override { return s_; }
  void set_weight(WeightId id, int layer, std::span<const float> data);  // throws on a size mismatch
  WeightSink sink() override;

  void reset() override;
  void load_layer(int layer, std::span<const HostEntry> entries) override;
  void keep_rows(int layer, int entry, std::span<const std::int64_t> rows) override;
  int entries(int layer) const;
  std::int64_t rows(int layer, int entry) const;
  std::span<const float> entry_k(int layer, int entry) const;
  std::span<const float> entry_v(int layer, int entry) const;

  std::vector<float> forward(std::span<const std::int32_t> tokens, std::span<const std::int32_t> positions,
                             std::span<const std::int64_t> logit_rows, bool want_q, bool record_last,
                             const LayerCallback& on_layer = {}) override;
  std::span<const float> last_attention(int layer, int q_head) const override;
  void set_last_on_host(bool on) override { last_on_host_ = on; }
  void start_rule(int layer, const DecodeRuleStart& start) override;
  std::vector<std::vector<std::vector<std::int64_t>>> rule_step(std::int64_t budget) override;
  std::string name() const override { return "cpu reference"; }

 private:
  struct Entry {
    std::vector<float> k, v;
  };
  const std::vector<float>& w(WeightId id, int layer) const;
  // x += in W_proj^T, through the `post` norm first where the shape has post-norms (gemma3).
  // Layer l's attention: the n new rows of k and v join its cache entries, then each query head
  // attends over its entry (causal, windowed) in double; the output [n, Q], last-row weights kept
  // when `record_last`.
  // Layer l's RoPE (its own base on sliding-window layers) on n rows of q and k, in place.
  void rotate(int l, std::int64_t n, std::span<const std::int32_t> positions, std::vector<float>& q,
              std::vector<float>& k) const;
  std::vector<float> attend(int l, std::int64_t n, const std::vector<float>& q, const std::vector<float>& k,
                            const std::vector<float>& v, bool record_last, float scale);
  void project_into_residual(const std::vector<float>& in, std::int64_t n, WeightId proj, WeightId post, int layer,
                             std::int64_t cols, std::vector<float>& x) const;
  ModelConfig s_;
  DeviceWeights dw_;
  std::vector<std::vector<float>> weights_;  // [(layer + 1) * n_ids + id]
  std::vector<std::vector<Entry>> cache_;
  std::vector<std::vector<std::vector<float>>> last_;  // [layer][q head]
  bool last_on_host_ = true, last_handed_ = false;     // the last forward() handed its weights to the host
  std::vector<bool> packed_layer_;                     // [layer] loaded with packed entries
  std::vector<std::optional<DecodeRuleStart>> rules_;  // [layer]
  bool rule_ready_ = false;                            // a one-row forward() with record_last since the last rule step
  std::vector<float> cos_, sin_, cos_local_, sin_local_;  // RoPE tables: every layer / sliding-window layers
  std::int64_t rope_rows_ = 0;
};

}  // namespace kvsim::gpu
