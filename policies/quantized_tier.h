#pragma once
// Shared by the uniform quantization baselines (intn.cpp, kivi.cpp): the byte budget of one cache
// at a compression point, and the keep rule when even quantized tokens do not all fit.
#include <cstdint>
#include <functional>
#include <vector>

#include "policies/policy.h"

namespace kvsim {

// The budget in bytes of one (layer, KV head) cache: the budget fraction of its full fp16 K/V.
double head_byte_budget(const LayerSignals& s, const Budget& b);

// Keeps every cached token if `bytes(n)` fits `budget`; else the first `sinks` and the most
// recent tokens, as many as fit (StreamingLLM's rule: these baselines spend no signal on
// choosing). Kept tokens get `codec`; bytes(k) is the cache's cost with k kept tokens.
HeadPlan fit_quantized(std::int64_t n, double budget, int sinks, TokenCodec codec,
                       const std::function<double(std::int64_t)>& bytes);

// fit_quantized for every KV head of a layer, each with the layer's per-head byte budget.
LayerPlan fit_every_head(const LayerSignals& s, const Budget& b, int sinks, TokenCodec codec,
                         const std::function<double(std::int64_t)>& bytes);

TokenCodec int_codec(int bits);

}  // namespace kvsim
