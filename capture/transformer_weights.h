#pragma once
// A GGUF model as the GPU backend and its CPU reference take it (gpu/transformer_shape.h): the
// geometry from LlamaConfig and every tensor dequantized to f32, one at a time, so a 7B model
// never sits on the host whole.
#include "capture/llama_model.h"
#include "gpu/transformer_shape.h"

namespace kvsim {

gpu::TransformerShape transformer_shape(const LlamaConfig& c);

// Streams every tensor weight_list() names, in that order; throws naming the file and the tensor
// when one is missing or has another shape.
void load_transformer_weights(const GgufFile& f, const gpu::TransformerShape& s, const gpu::WeightSink& sink);

}  // namespace kvsim
