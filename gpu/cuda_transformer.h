#pragma once
// The CUDA transformer backend: a llama/qwen2 or gemma3 forward pass on one GPU with the
// interface, cache layout and rounding points of its CPU reference (gpu/cuda_transformer_ref.h):
// fp16 (or fp32) weights, cuBLAS GEMMs, gpu/transformer_kernels.cuh for the rest, packed cache
// entries attended where they are, Q/K/V handed to a layer callback on a second stream. Design:
// docs/gpu.md.
// No CUDA types here: callers compile as plain C++.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gpu/transformer_backend.h"

namespace kvsim::gpu {

// How a decode step attends over a layer held packed: in the attention kernel (the default), or
// by unpacking the layer first as a chunk does (kept for the parity harness and the benchmark).
enum class PackedDecode { Fused, Unpack };

class CudaTransformer : public TransformerBackend {
 public:
  // Throws (naming the device) when there is no usable GPU or the shape is unsupported
  // (head_dim not 32/64/96/128/256, more than 256 cache entries per layer).
  CudaTransformer(const ModelConfig& s, DeviceWeights w, int device = 0);
  ~CudaTransformer() override;
  CudaTransformer(CudaTransformer&&) noexcept;
  CudaTransformer& operator=(CudaTransformer&&) noexcept;

  const ModelConfig& shape() const override;
  void set_weight(WeightId id, int layer, std::span<const float> data);  // throws on a size mismatch
  WeightSink sink() override;

  void reset() override;
  void load_layer(int layer, std::span<const HostEntry> entries) override;
  void keep_rows(int layer, int entry, std::span<const std::int64_t> rows) override;  // gathered on the device
  int entries(int layer) const;
  std::int64_t rows(int layer, int entry) const;
  std::vector<float> entry_k(int layer, int entry) const;
  std::vector<float> entry_v(int layer, int entry) const;

  // TransformerRef::forward's contract.
  std::vector<float> forward(std::span<const std::int32_t> tokens, std::span<const std::int32_t> positions,
                             std::span<const std::int64_t> logit_rows, bool want_q, bool record_last,
                             const LayerCallback& on_layer = {}) override;
  std::span<const float> last_attention(int layer, int q_head) const override;
  void set_last_on_host(bool on) override;
  // Decode rules run on the device (gpu/policy_step.cuh): scores, evictions and the compaction of
  // the fp16 rows; one copy of the evicted rows to the host per step. Layers held packed refuse.
  void start_rule(int layer, const DecodeRuleStart& start) override;
  std::vector<std::vector<std::vector<std::int64_t>>> rule_step(std::int64_t budget) override;
  void set_packed_decode(PackedDecode how);
  std::string name() const override;  // "cuda:N (device name)"

  std::size_t weight_bytes() const;  // on the device
  // Device bytes the KV cache holds: each layer's fp16 row buffers (allocated capacity) and its
  // packed entries as stored; beside it, the one-layer scratch packed layers are unpacked into
  // (made by the first chunk over a packed layer, or a decode step with PackedDecode::Unpack).
  std::size_t cache_bytes() const;
  std::size_t unpack_scratch_bytes() const;
  std::string device_name() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Usable CUDA devices (0 without a driver or a GPU); `why` says what was found when there is none.
int cuda_devices(std::string* why = nullptr);

}  // namespace kvsim::gpu
