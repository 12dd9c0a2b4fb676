#pragma once
// What a prefix block is worth recomputing: the serving cost model's prefill term. Prefill of l
// tokens costs a + b*l + c*l^2 (the quadratic term is attention), so recomputing the tokens
// [s, s + t) of a prompt costs b*t + c*((s + t)^2 - s^2): deeper blocks cost more.
#include <cstdint>
#include <string>

namespace kvsim::serve {

struct PrefillCost {
  std::string name = "llama2-7b-h100";
  double a_ms = 0;
  // Llama-2-7B-class on an H100-class GPU at 40% of its 989 dense BF16 TFLOP/s: 2 x 6.7e9 FLOP
  // per token for the weights, 4 x 32 layers x 4096 FLOP per (query, key) pair for attention,
  // of which causal prefill visits l^2/2 (docs/serving.md).
  double b_ms_per_token = 2 * 6.7e9 / 3.956e14 * 1e3;
  double c_ms_per_token2 = 0.5 * 4.0 * 32 * 4096 / 3.956e14 * 1e3;
  double prefill_ms(std::int64_t tokens) const {
    const auto l = static_cast<double>(tokens);
    return tokens > 0 ? a_ms + b_ms_per_token * l + c_ms_per_token2 * l * l : 0.0;
  }
  // Recomputing `tokens` tokens that follow `start` cached ones.
  double recompute_ms(std::int64_t start, std::int64_t tokens) const {
    const auto s = static_cast<double>(start), t = static_cast<double>(tokens);
    return b_ms_per_token * t + c_ms_per_token2 * ((s + t) * (s + t) - s * s);
  }
};

}  // namespace kvsim::serve
