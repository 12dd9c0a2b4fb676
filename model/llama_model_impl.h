#pragma once
// The CPU engine's state, shared by its forward pass (llama_model.cpp) and its cache refresh
// (cache_refresh.cpp). Internal to model/.
#include <vector>

#include "model/kv_cache.h"
#include "model/llama_model.h"
#include "model/transformer_layer.h"
#include "model/weight_matrix.h"

namespace kvsim {

struct LlamaModel::Impl {
  WeightMatrix embd, output;  // [vocab, n_embd]
  layer_ops::Vec output_norm;
  std::vector<layer_ops::Layer> layers;
  KvCache cache;
  bool record_attention = false;
  std::vector<std::vector<std::vector<float>>> last_attention;  // [layer][q head]
};

}  // namespace kvsim
