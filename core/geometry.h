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
  RopeSpec rope;                    // rope.head_dim == head_dim; rope.rope_dim rotated dims (n_rot)
  std::vector<int> sliding_window;  // per layer, 0 = full attention; empty = none anywhere
  double rope_theta_local = 0;      // RoPE base of sliding-window layers (gemma3); 0 = rope.theta

  // Layer l's RoPE: the local base on sliding-window layers where one is set.
  RopeSpec rope_at(int layer) const {
    RopeSpec r = rope;
    if (rope_theta_local > 0 && window(layer) > 0) r.theta = rope_theta_local;
    return r;
  }
  int window(int layer) const {  // tokens a layer attends to (itself included); 0 = all
    return sliding_window.empty() ? 0 : sliding_window[static_cast<std::size_t>(layer)];
  }

  int group() const { return n_q_heads / n_kv_heads; }  // query heads per KV head
  std::int64_t q_dim() const { return static_cast<std::int64_t>(n_q_heads) * head_dim; }
  std::int64_t kv_dim() const { return static_cast<std::int64_t>(n_kv_heads) * head_dim; }
  bool operator==(const ModelGeometry&) const = default;
};

// What a trace, a learned model file and a live engine must share for one to stand for another:
// layers, query heads, KV heads and head size (names, vocabularies and RoPE may differ).
bool same_kv_shape(const ModelGeometry& a, const ModelGeometry& b);
// That shape in words, for the error that refuses a mismatch: "30 layers, 9/3 query/KV heads, head_dim 64".
std::string kv_shape(const ModelGeometry& g);

enum class FfnAct { Silu, GeluTanh };  // the gate's activation: SwiGLU (llama) or GeGLU (gemma)

struct ModelConfig : ModelGeometry {
  int n_embd = 0;
  int n_ff = 0;
  double rms_eps = 1e-5;
  bool qkv_bias = false;         // Q/K/V biases (qwen2)
  bool tied_embeddings = false;  // logits from token_embd (no output tensor)
  FfnAct ffn_act = FfnAct::Silu;
  bool qk_norm = false;     // RMSNorm on each head's query and key (gemma3)
  bool post_norms = false;  // RMSNorm on the attention and feed-forward outputs (gemma3)
  double embd_scale = 1.0;  // embeddings times this (gemma: sqrt(n_embd))
  double attn_scale = 0;    // q.k scale; 0 = 1/sqrt(head_dim)
  // Throws std::invalid_argument naming the first inconsistent field.
  void check() const;
};

}  // namespace kvsim
