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

#include "capture/kv_cache.h"
#include "capture/weight_matrix.h"
#include "core/rope.h"

namespace kvsim {

class GgufFile;

struct LlamaConfig {
  std::string arch;  // "llama" | "qwen2"
  int n_layers = 0, n_embd = 0, n_head = 0, n_head_kv = 0, head_dim = 0, n_ff = 0;
  std::int64_t vocab = 0;
  double rms_eps = 1e-5;
  RopeSpec rope;
  bool tied_embeddings = false;
  static LlamaConfig from_gguf(const GgufFile& f);  // throws naming a missing or bad key
};

// What a forward pass exposes per layer, for n new tokens (rows), post-RoPE, row-major:
// q [n, n_head, head_dim], k and v [n, n_head_kv, head_dim].
struct LayerActivations {
  int layer;
  std::int64_t n;
  std::span<const float> q, k, v;
};

class LlamaModel {
 public:
  // With WeightFormat::Quantized the weights stay in `f`'s mapping: `f` must outlive the model.
  explicit LlamaModel(const GgufFile& f, WeightFormat weights = WeightFormat::Quantized);
  ~LlamaModel();
  const LlamaConfig& config() const { return cfg_; }

  // Appends `tokens` at `positions` to the KV cache and returns the logits of the rows listed
  // in `logit_rows` (indices into tokens), [rows, vocab]. `hook` (optional) sees every layer.
  std::vector<float> forward(std::span<const std::int32_t> tokens, std::span<const std::int32_t> positions,
                             std::span<const std::int64_t> logit_rows,
                             const std::function<void(const LayerActivations&)>& hook = {});
  // Convenience over forward() for sequential use: `tokens` continue the cached sequence at the
  // next positions, in chunks of `chunk`; returns the last token's logits [vocab].
  std::vector<float> prefill(std::span<const std::int32_t> tokens, std::int64_t chunk = 256,
                             const std::function<void(const LayerActivations&)>& hook = {});
  // One decode step: `token` at the next position; returns its logits [vocab].
  std::vector<float> step(std::int32_t token, const std::function<void(const LayerActivations&)>& hook = {});
  void reset();                           // empties the KV cache: one full entry per KV head
  void reserve(std::int64_t tokens);      // sizes the KV cache for this many tokens
  std::int64_t cached_tokens() const;     // tokens run through since reset() (the next index)
  // The cache (kv_cache.h). Compression edits it between forward() calls; set_cache restores a
  // saved copy (e.g. the state after a shared prefill).
  const KvCache& cache() const;
  KvCache& cache();
  void set_cache(KvCache cache);
  // When on, forward() keeps each layer's attention weights of its last row over the entry the
  // query head reads (aligned with that entry's tokens): what decode-time policies read.
  void record_last_attention(bool on);
  std::span<const float> last_attention(int layer, int q_head) const;
  WeightFormat weight_format() const { return weights_; }
  std::size_t weight_heap_bytes() const;  // weights copied to the heap (f32 form)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  LlamaConfig cfg_;
  WeightFormat weights_;
};

}  // namespace kvsim
