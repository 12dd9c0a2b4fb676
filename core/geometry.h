#pragma once
// A model's shape in one vocabulary, used by traces, policies, the engines and the GPU backend:
// ModelGeometry is what a KV cache and a trace need (layers, query and KV heads, head size,
// RoPE); ModelConfig adds what a forward pass needs. A ModelConfig is a ModelGeometry, so no
// border copies one into another field by field.
#include <cstdint>
#include <string>
#include <vector>

#include "core/rope.h"

namespace kvsim {

struct ModelGeometry {
  std::string name = "synthetic";
  std::string arch = "llama";
  int n_layers = 0;
  int n_q_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  std::int64_t vocab = 0;
  RopeSpec rope;                     // rope.head_dim == head_dim; rope.rope_dim rotated dims (n_rot)
  std::vector<int> sliding_window;   // per layer, 0 = full attention; empty = none anywhere

  int group() const { return n_q_heads / n_kv_heads; }  // query heads per KV head
  std::int64_t q_dim() const { return static_cast<std::int64_t>(n_q_heads) * head_dim; }
  std::int64_t kv_dim() const { return static_cast<std::int64_t>(n_kv_heads) * head_dim; }
  bool operator==(const ModelGeometry&) const = default;
};

struct ModelConfig : ModelGeometry {
  int n_embd = 0;
  int n_ff = 0;
  double rms_eps = 1e-5;
  bool qkv_bias = false;         // Q/K/V biases (qwen2)
  bool tied_embeddings = false;  // logits from token_embd (no output tensor)
  // Throws std::invalid_argument naming the first inconsistent field.
  void check() const;
};

}  // namespace kvsim
