#include "kvcache/budget.h"

#include <algorithm>
#include <cmath>

#include "policies/codec.h"

namespace kvsim {

ConfigBudget config_budget(const Policy& policy, double fraction, std::int64_t tokens_at_point, int head_dim) {
  ConfigBudget b;
  b.kv_token_bytes = codec_token_bytes(TokenCodec::Fp16, head_dim);
  b.compress = policy.respects_budget() && fraction < 1.0;
  b.token_bytes = b.kv_token_bytes + (b.compress ? policy.state_bytes_per_token() : 0.0);
  b.head_bytes = b.compress ? policy.state_bytes_per_head() : 0.0;
  b.tokens = b.compress ? std::max<std::int64_t>(
                              0, static_cast<std::int64_t>(std::floor(
                                     (fraction * static_cast<double>(tokens_at_point) * b.kv_token_bytes - b.head_bytes) /
                                     b.token_bytes)))
                        : tokens_at_point;
  return b;
}

double cache_bytes(const ConfigBudget& b, double rows, std::int64_t entries_per_layer, int layers) {
  return rows * b.token_bytes + b.head_bytes * static_cast<double>(layers) * static_cast<double>(entries_per_layer);
}

}  // namespace kvsim
