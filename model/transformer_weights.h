#pragma once
// A GGUF model's tensors as the GPU backend and its CPU reference take them
// (gpu/transformer_shape.h's weight list): every tensor dequantized to f32, one at a time, so a 7B
// model never sits on the host whole.
#include "model/llama_model.h"
#include "gpu/transformer_shape.h"

namespace kvsim {

// Streams every tensor weight_list() names, in that order; throws naming the file and the tensor
// when one is missing or has another shape.
void load_transformer_weights(const GgufFile& f, const ModelConfig& s, const gpu::WeightSink& sink);

}  // namespace kvsim
