#include "model/dequant.h"

#include <bit>
#include <cstring>
#include <string>
#include <utility>

#include "core/error.h"
#include "core/half.h"

// Built with -ffp-contract=off (capture/CMakeLists.txt): a fused multiply-add would round once
// where gguf-py (numpy) rounds twice, and the bit-for-bit comparison would fail.

namespace kvsim {
namespace {

float f16(const std::uint8_t* p) {
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return half_to_float(h);
}

// Q4_K / Q5_K 6-bit scale and min of sub-block j (get_scale_min_k4).
void scale_min_k4(int j, const std::uint8_t* q, std::uint8_t& sc, std::uint8_t& mn) {
  if (j < 4) {
    sc = q[j] & 63;
    mn = q[j + 4] & 63;
  } else {
    sc = static_cast<std::uint8_t>((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4));
    mn = static_cast<std::uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// Q4_K / Q5_K: the scale (d * sc) and offset (dmin * m) of 32-element sub-block j, as gguf-py
// computes them (each a single f32 product).
std::pair<float, float> sub_block_scale(int j, const std::uint8_t* scales, float d, float dmin) {
  std::uint8_t sc, mn;
  scale_min_k4(j, scales, sc, mn);
  return {d * static_cast<float>(sc), dmin * static_cast<float>(mn)};
}

void q4_0(const std::uint8_t* b, float* y) {
  const float d = f16(b);
  const std::uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>((qs[j] & 0x0F) - 8);
    y[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
  }
}

void q4_1(const std::uint8_t* b, float* y) {
  const float d = f16(b), m = f16(b + 2);
  const std::uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(qs[j] & 0x0F) + m;
    y[j + 16] = d * static_cast<float>(qs[j] >> 4) + m;
  }
}

void q5_0(const std::uint8_t* b, float* y) {
  const float d = f16(b);
  std::uint32_t qh;
  std::memcpy(&qh, b + 2, 4);
  const std::uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1u) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    y[j] = d * static_cast<float>(lo - 16);
    y[j + 16] = d * static_cast<float>(hi - 16);
  }
}

void q5_1(const std::uint8_t* b, float* y) {
  const float d = f16(b), m = f16(b + 2);
  std::uint32_t qh;
  std::memcpy(&qh, b + 4, 4);
  const std::uint8_t* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1u) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    y[j] = d * static_cast<float>(lo) + m;
    y[j + 16] = d * static_cast<float>(hi) + m;
  }
}

void q8_0(const std::uint8_t* b, float* y) {
  const float d = f16(b);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<std::int8_t>(b[2 + j])) * d;
}

void q4_k(const std::uint8_t* b, float* y) {
  const float d = f16(b), dmin = f16(b + 2);
  const std::uint8_t* scales = b + 4;
  const std::uint8_t* qs = b + 16;
  for (int c = 0; c < 4; ++c) {
    const auto [d0, dm0] = sub_block_scale(2 * c, scales, d, dmin);
    const auto [d1, dm1] = sub_block_scale(2 * c + 1, scales, d, dmin);
    for (int l = 0; l < 32; ++l) {
      y[64 * c + l] = d0 * static_cast<float>(qs[32 * c + l] & 0x0F) - dm0;
      y[64 * c + 32 + l] = d1 * static_cast<float>(qs[32 * c + l] >> 4) - dm1;
    }
  }
}

void q5_k(const std::uint8_t* b, float* y) {
  const float d = f16(b), dmin = f16(b + 2);
  const std::uint8_t* scales = b + 4;
  const std::uint8_t* qh = b + 16;
  const std::uint8_t* qs = b + 48;
  for (int c = 0; c < 4; ++c) {
    const auto [d0, dm0] = sub_block_scale(2 * c, scales, d, dmin);
    const auto [d1, dm1] = sub_block_scale(2 * c + 1, scales, d, dmin);
    for (int l = 0; l < 32; ++l) {
      const int lo = (qs[32 * c + l] & 0x0F) | (((qh[l] >> (2 * c)) & 1) << 4);
      const int hi = (qs[32 * c + l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4);
      y[64 * c + l] = d0 * static_cast<float>(lo) - dm0;
      y[64 * c + 32 + l] = d1 * static_cast<float>(hi) - dm1;
    }
  }
}

void q6_k(const std::uint8_t* b, float* y) {
  const std::uint8_t* ql = b;
  const std::uint8_t* qh = b + 128;
  const auto* scales = reinterpret_cast<const std::int8_t*>(b + 192);
  const float d = f16(b + 208);
  for (int n = 0; n < 2; ++n) {
    const std::uint8_t* QL = ql + 64 * n;
    const std::uint8_t* QH = qh + 32 * n;
    const std::int8_t* S = scales + 8 * n;
    float* Y = y + 128 * n;
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((QL[l] & 0x0F) | (((QH[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((QL[l + 32] & 0x0F) | (((QH[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((QL[l] >> 4) | (((QH[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((QL[l + 32] >> 4) | (((QH[l] >> 6) & 3) << 4)) - 32;
      Y[l] = (d * static_cast<float>(S[is + 0])) * static_cast<float>(q1);
      Y[l + 32] = (d * static_cast<float>(S[is + 2])) * static_cast<float>(q2);
      Y[l + 64] = (d * static_cast<float>(S[is + 4])) * static_cast<float>(q3);
      Y[l + 96] = (d * static_cast<float>(S[is + 6])) * static_cast<float>(q4);
    }
  }
}

using BlockFn = void (*)(const std::uint8_t*, float*);

}  // namespace

void dequantize_row(GgmlType type, const std::uint8_t* src, float* dst, std::int64_t n) {
  switch (type) {
    case GgmlType::F32: std::memcpy(dst, src, static_cast<std::size_t>(n) * 4); return;
    case GgmlType::F16:
      halves_to_floats_scalar(reinterpret_cast<const std::uint16_t*>(src), dst, static_cast<std::size_t>(n));
      return;
    case GgmlType::BF16:
      for (std::int64_t i = 0; i < n; ++i) {
        std::uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
      }
      return;
    default: break;
  }
  BlockFn fn = nullptr;
  switch (type) {
    case GgmlType::Q4_0: fn = q4_0; break;
    case GgmlType::Q4_1: fn = q4_1; break;
    case GgmlType::Q5_0: fn = q5_0; break;
    case GgmlType::Q5_1: fn = q5_1; break;
    case GgmlType::Q8_0: fn = q8_0; break;
    case GgmlType::Q4_K: fn = q4_k; break;
    case GgmlType::Q5_K: fn = q5_k; break;
    case GgmlType::Q6_K: fn = q6_k; break;
    default: {
      const GgmlTypeInfo* info = ggml_type_info(static_cast<std::uint32_t>(type));
      throw Error(std::string("no dequantizer for ggml type ") + (info ? info->name : "?") + " (" +
                  std::to_string(static_cast<std::uint32_t>(type)) + ")");
    }
  }
  const GgmlTypeInfo* info = ggml_type_info(static_cast<std::uint32_t>(type));
  for (std::int64_t b = 0; b < n / info->block; ++b) fn(src + b * info->bytes, dst + b * info->block);
}

}  // namespace kvsim
