#pragma once
// The model geometries the parity harness runs with random weights (plain C++: the CPU tests
// check that the reference runs every one of them).
#include <string>
#include <utility>
#include <vector>

#include "gpu/transformer_shape.h"

namespace kvsim::gpu {

// Geometries the harness runs with random weights: SmolLM2-135M (all 30 layers), Mistral-7B's
// layer shapes (2 of its 32 layers: the widths are what the kernels see), and a small qwen2-like
// model with Q/K/V biases and NeoX pairing (the other RoPE layout).
ModelConfig smollm2_shape();
ModelConfig mistral7b_shape(int layers);
ModelConfig qwen_like_shape();
// A small Gemma 3-like block: q/k norms, post-norms, GeGLU, scaled embeddings, a q.k scale that is
// not 1/sqrt(head_dim), and sliding-window layers (window 24, shorter than the harness's
// prompts, not a tile's multiple) with their own RoPE base beside a global layer; MQA.
ModelConfig gemma_like_shape();
// Small models at the kernels' other head sizes (32, 96, 256), plain MHA and MQA, partial rotary.
std::vector<std::pair<std::string, ModelConfig>> kernel_corner_shapes();

}  // namespace kvsim::gpu
