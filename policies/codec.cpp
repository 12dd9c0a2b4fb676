#include "policies/codec.h"

#include <algorithm>

#include "core/error.h"
#include "core/packed_kv.h"

namespace kvsim {

double codec_token_bytes(TokenCodec codec, int head_dim) {
  switch (codec) {
    case TokenCodec::Drop:
      return 0.0;
    case TokenCodec::Fp16:
      return 2.0 * 2.0 * head_dim;  // K and V, 2 bytes each
    default:
      break;
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
    case TokenCodec::Drop:
      return "drop";
    case TokenCodec::Fp16:
      return "fp16";
    case TokenCodec::Int8:
      return "int8";
    case TokenCodec::Int4:
      return "int4";
    case TokenCodec::Int2:
      return "int2";
    case TokenCodec::LowRank:
      return "lowrank";
  }
  return "?";
}

bool codec_reconstruct(TokenCodec codec, std::span<const float> k, std::span<const float> v, std::span<float> k_hat,
                       std::span<float> v_hat) {
  switch (codec) {
    case TokenCodec::Drop:
      return false;
    case TokenCodec::Fp16:
      std::copy(k.begin(), k.end(), k_hat.begin());
      std::copy(v.begin(), v.end(), v_hat.begin());
      return true;
    default:
      break;
  }
  throw Error(std::string("codec ") + codec_name(codec) + ": reconstruction not available yet");
}

void KvCodec::pack(const HeadPlan&, const ModelGeometry&, std::span<const std::int32_t>, std::span<const float>,
                   std::span<const float>, PackedEntry&) const {
  throw Error("codec: this policy's encoding has no packed (device) form yet; verify it with --device cpu");
}

void pack_plan(const KvCodec* codec, const HeadPlan& plan, const ModelGeometry& g,
               std::span<const std::int32_t> positions, std::span<const float> keys, std::span<const float> values,
               PackedEntry& out) {
  const auto d = static_cast<std::size_t>(g.head_dim);
  const auto kept = static_cast<std::size_t>(plan.kept());
  if (positions.size() != kept || keys.size() != kept * d || values.size() != kept * d)
    throw Error("pack: a plan keeping " + std::to_string(kept) + " tokens got " + std::to_string(positions.size()) +
                " positions and " + std::to_string(keys.size()) + " / " + std::to_string(values.size()) +
                " key / value floats");
  if (needs_codec(plan)) {
    if (!codec) throw Error("pack: the plan has encoded tokens but the policy has no codec");
    codec->pack(plan, g, positions, keys, values, out);
  } else {
    out = PackedEntry{};
    out.head_dim = g.head_dim;
    for (std::size_t row = 0; row < kept; ++row) {
      pack_fp16_row(out.k, keys.data() + row * d, g.head_dim, positions[row]);
      pack_fp16_row(out.v, values.data() + row * d, g.head_dim, positions[row]);
    }
  }
  check_packed(out);
}

}  // namespace kvsim
