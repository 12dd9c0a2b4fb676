#include <catch2/catch.hpp>

#include <vector>

#include "core/error.h"
#include "policies/codec.h"

using namespace kvsim;

TEST_CASE("drop and fp16 codecs: bytes and reconstruction", "[codec]") {
  CHECK(codec_token_bytes(TokenCodec::Fp16, 64) == 256.0);  // K + V, 2 bytes each
  CHECK(codec_token_bytes(TokenCodec::Drop, 64) == 0.0);
  const std::vector<float> k = {1, 2, 3}, v = {-1, 0.5f, 7};
  std::vector<float> kh(3, 0), vh(3, 0);
  CHECK(codec_reconstruct(TokenCodec::Fp16, k, v, kh, vh));
  CHECK(kh == k);
  CHECK(vh == v);
  CHECK_FALSE(codec_reconstruct(TokenCodec::Drop, k, v, kh, vh));
  CHECK(codec_supported(TokenCodec::Fp16));
  CHECK_FALSE(codec_supported(TokenCodec::Int4));
  CHECK_THROWS_WITH(codec_token_bytes(TokenCodec::Int4, 64), Catch::Contains("codec int4"));
  CHECK_THROWS_WITH(codec_reconstruct(TokenCodec::LowRank, k, v, kh, vh), Catch::Contains("codec lowrank"));
}
