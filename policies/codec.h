#pragma once
// Codecs turn a plan's per-token encoding into bytes and into the reconstructed K̂/V̂ that the
// metrics compare against. Drop and fp16 are complete here; intN and low-rank plug into the same
// two functions in a later issue (the engine rejects them until then).
#include <cstdint>
#include <span>

#include "policies/policy.h"

namespace kvsim {

// Bytes one token costs in one (layer, KV head) under `codec`: keys and values together,
// including per-token metadata the codec needs (scales, coefficients).
double codec_token_bytes(TokenCodec codec, int head_dim);

// Whether the replay can reconstruct this encoding today.
bool codec_supported(TokenCodec codec);
const char* codec_name(TokenCodec codec);

// Reconstructs one token's key and value (head_dim floats each) as the cache would hold them.
// Drop yields nothing (returns false). The trace already stores fp16, so fp16 is the identity.
bool codec_reconstruct(TokenCodec codec, std::span<const float> k, std::span<const float> v, std::span<float> k_hat,
                       std::span<float> v_hat);

}  // namespace kvsim
