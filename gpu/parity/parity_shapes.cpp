#include "gpu/parity/parity_shapes.h"

#include <cmath>

namespace kvsim::gpu {

ModelConfig smollm2_shape() {
  ModelConfig s;
  s.n_layers = 30, s.n_embd = 576, s.n_q_heads = 9, s.n_kv_heads = 3, s.head_dim = 64, s.n_ff = 1536, s.vocab = 49152;
  s.rope = RopeSpec{RopeType::Norm, 64, 64, 100000.0};
  s.tied_embeddings = true;
  return s;
}

ModelConfig mistral7b_shape(int layers) {
  ModelConfig s;
  s.n_layers = layers, s.n_embd = 4096, s.n_q_heads = 32, s.n_kv_heads = 8, s.head_dim = 128, s.n_ff = 14336,
  s.vocab = 32000;
  s.rope = RopeSpec{RopeType::Norm, 128, 128, 1000000.0};
  return s;
}

std::vector<std::pair<std::string, ModelConfig>> kernel_corner_shapes() {
  std::vector<std::pair<std::string, ModelConfig>> out;
  ModelConfig s;
  s.n_layers = 2, s.n_embd = 192, s.n_q_heads = 6, s.n_kv_heads = 2, s.head_dim = 32, s.n_ff = 256, s.vocab = 500;
  s.rope = RopeSpec{RopeType::Norm, 32, 16, 10000.0};  // adjacent pairs, partial rotary, Q/K/V biases
  s.qkv_bias = true;
  out.emplace_back("head_dim 32, group 3, rope_dim 16 (norm), biases", s);
  s.qkv_bias = false;
  s.n_embd = 288, s.n_q_heads = 3, s.n_kv_heads = 3, s.head_dim = 96;  // plain multi-head, partial rotary
  s.rope = RopeSpec{RopeType::Neox, 96, 64, 10000.0};
  out.emplace_back("head_dim 96, MHA, rope_dim 64 (neox)", s);
  s.n_embd = 512, s.n_q_heads = 4, s.n_kv_heads = 1, s.head_dim = 256;  // one KV head for four
  s.rope = RopeSpec{RopeType::Norm, 256, 256, 10000.0};
  out.emplace_back("head_dim 256, MQA", s);
  return out;
}

ModelConfig qwen_like_shape() {
  ModelConfig s;
  s.n_layers = 3, s.n_embd = 256, s.n_q_heads = 4, s.n_kv_heads = 2, s.head_dim = 64, s.n_ff = 704, s.vocab = 1000;
  s.rope = RopeSpec{RopeType::Neox, 64, 64, 1000000.0};
  s.qkv_bias = true;
  s.rms_eps = 1e-6;
  return s;
}

ModelConfig gemma_like_shape() {
  ModelConfig s;
  s.arch = "gemma3";
  s.n_layers = 3, s.n_embd = 192, s.n_q_heads = 4, s.n_kv_heads = 1, s.head_dim = 64, s.n_ff = 384, s.vocab = 700;
  s.rope = RopeSpec{RopeType::Neox, 64, 64, 1000000.0};
  s.rope_theta_local = 10000.0;
  s.sliding_window = {24, 24, 0};
  s.tied_embeddings = true;
  s.ffn_act = FfnAct::GeluTanh;
  s.qk_norm = true;
  s.post_norms = true;
  s.embd_scale = std::sqrt(192.0);
  s.attn_scale = 1.0 / std::sqrt(48.0);
  s.rms_eps = 1e-6;
  return s;
}

}  // namespace kvsim::gpu
