#include "policies/quantized_tier.h"

#include <algorithm>

#include "core/error.h"
#include "core/packed_kv.h"
#include "policies/codec.h"

namespace kvsim {

double head_byte_budget(const LayerSignals& s, const Budget& b) {
  return b.fraction * static_cast<double>(s.n_tokens()) * codec_token_bytes(TokenCodec::Fp16, s.geometry().head_dim);
}

HeadPlan fit_quantized(std::int64_t n, double budget, int sinks, TokenCodec codec,
                       const std::function<double(std::int64_t)>& bytes) {
  std::int64_t lo = 0, hi = n;  // largest k in [0, n] with bytes(k) <= budget (bytes grows with k)
  while (lo < hi) {
    const std::int64_t mid = (lo + hi + 1) / 2;
    if (bytes(mid) <= budget)
      lo = mid;
    else
      hi = mid - 1;
  }
  HeadPlan p;
  p.position_fallback = lo < n;
  p.codec.assign(static_cast<std::size_t>(n), TokenCodec::Drop);
  const std::int64_t head = std::min<std::int64_t>({sinks, lo, n});
  for (std::int64_t j = 0; j < head; ++j) p.codec[static_cast<std::size_t>(j)] = codec;
  for (std::int64_t j = n - (lo - head); j < n; ++j) p.codec[static_cast<std::size_t>(j)] = codec;
  return p;
}

LayerPlan fit_every_head(const LayerSignals& s, const Budget& b, int sinks, TokenCodec codec,
                         const std::function<double(std::int64_t)>& bytes) {
  LayerPlan plan;
  for (int kv = 0; kv < s.geometry().n_kv_heads; ++kv)
    plan.heads.push_back(
        fit_quantized(static_cast<std::int64_t>(s.cached(kv).size()), head_byte_budget(s, b), sinks, codec, bytes));
  return plan;
}

TokenCodec int_codec(int bits) {
  switch (bits) {
    case 8:
      return TokenCodec::Int8;
    case 4:
      return TokenCodec::Int4;
    case 2:
      return TokenCodec::Int2;
  }
  throw Error("bits = " + std::to_string(bits) + ", expected 2, 4 or 8");
}

double IntCodec::bytes(const HeadPlan& plan, int d) const {
  double b = 0;
  for (TokenCodec c : plan.codec)
    b += c == TokenCodec::Drop ? 0.0 : c == TokenCodec::Fp16 ? codec_token_bytes(c, d) : 2 * int_row_bytes(s_, d);
  return b;
}

double IntCodec::host_bytes(const HeadPlan& plan, int d) const {
  if (!host_copy_) return 0.0;
  double b = 0;
  for (TokenCodec c : plan.codec)
    if (c != TokenCodec::Drop && c != TokenCodec::Fp16) b += codec_token_bytes(TokenCodec::Fp16, d);
  return b;
}

void IntCodec::reconstruct(const HeadPlan& plan, const ModelGeometry& g, std::span<const std::int32_t>,
                           std::span<float> keys, std::span<float> values) const {
  const auto d = static_cast<std::size_t>(g.head_dim);
  std::size_t row = 0;
  for (TokenCodec c : plan.codec) {
    if (c == TokenCodec::Drop) continue;
    if (c != TokenCodec::Fp16) {
      int_roundtrip(s_, keys.subspan(row * d, d));
      int_roundtrip(s_, values.subspan(row * d, d));
    }
    ++row;
  }
}

void IntCodec::pack(const HeadPlan& plan, const ModelGeometry& g, std::span<const std::int32_t> positions,
                    std::span<const float> keys, std::span<const float> values, PackedEntry& out) const {
  const auto d = static_cast<std::size_t>(g.head_dim);
  out = PackedEntry{};
  out.head_dim = g.head_dim;
  std::size_t row = 0;
  for (TokenCodec c : plan.codec) {
    if (c == TokenCodec::Drop) continue;
    if (c == TokenCodec::Fp16) {
      pack_fp16_row(out.k, keys.data() + row * d, g.head_dim, positions[row]);
      pack_fp16_row(out.v, values.data() + row * d, g.head_dim, positions[row]);
    } else {
      int_pack_row(s_, keys.subspan(row * d, d), positions[row], out.k);
      int_pack_row(s_, values.subspan(row * d, d), positions[row], out.v);
    }
    ++row;
  }
}

}  // namespace kvsim
