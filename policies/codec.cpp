#include "policies/codec.h"

#include <algorithm>

#include "core/error.h"

namespace kvsim {

double codec_token_bytes(TokenCodec codec, int head_dim) {
  switch (codec) {
    case TokenCodec::Drop: return 0.0;
    case TokenCodec::Fp16: return 2.0 * 2.0 * head_dim;  // K and V, 2 bytes each
    default: break;
  }
  throw Error(std::string("codec ") + codec_name(codec) + ": byte model not available yet");
}

bool codec_supported(TokenCodec codec) { return codec == TokenCodec::Drop || codec == TokenCodec::Fp16; }

bool needs_codec(const HeadPlan& plan) {
  return std::any_of(plan.codec.begin(), plan.codec.end(),
                     [](TokenCodec c) { return c != TokenCodec::Drop && c != TokenCodec::Fp16; });
}

const char* codec_name(TokenCodec codec) {
  switch (codec) {
    case TokenCodec::Drop: return "drop";
    case TokenCodec::Fp16: return "fp16";
    case TokenCodec::Int8: return "int8";
    case TokenCodec::Int4: return "int4";
    case TokenCodec::Int2: return "int2";
    case TokenCodec::LowRank: return "lowrank";
  }
  return "?";
}

bool codec_reconstruct(TokenCodec codec, std::span<const float> k, std::span<const float> v, std::span<float> k_hat,
                       std::span<float> v_hat) {
  switch (codec) {
    case TokenCodec::Drop: return false;
    case TokenCodec::Fp16:
      std::copy(k.begin(), k.end(), k_hat.begin());
      std::copy(v.begin(), v.end(), v_hat.begin());
      return true;
    default: break;
  }
  throw Error(std::string("codec ") + codec_name(codec) + ": reconstruction not available yet");
}

}  // namespace kvsim
