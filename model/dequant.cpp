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
    case GgmlType::F32:
      std::memcpy(dst, src, static_cast<std::size_t>(n) * 4);
      return;
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
    default:
      break;
  }
  BlockFn fn = nullptr;
  switch (type) {
    case GgmlType::Q4_0:
      fn = q4_0;
      break;
    case GgmlType::Q4_1:
      fn = q4_1;
      break;
    case GgmlType::Q5_0:
      fn = q5_0;
      break;
    case GgmlType::Q5_1:
      fn = q5_1;
      break;
    case GgmlType::Q8_0:
      fn = q8_0;
      break;
    case GgmlType::Q4_K:
      fn = q4_k;
      break;
    case GgmlType::Q5_K:
      fn = q5_k;
      break;
    case GgmlType::Q6_K:
      fn = q6_k;
      break;
    default: {
      const GgmlTypeInfo* info = ggml_type_info(static_cast<std::uint32_t>(type));
      throw Error(std::string("no dequantizer for ggml type ") + (info ? info->name : "?") + " (" +
                  std::to_string(static_cast<std::uint32_t>(type)) + ")");
    }
  }
  const GgmlTypeInfo* info = ggml_type_info(static_cast<std::uint32_t>(type));
  for (std::int64_t b = 0; b < n / info->block; ++b) fn(src + b * info->bytes, dst + b * info->block);
}

namespace {

// One block's groups of 16: q for every element, s and o per group.
struct Groups {
  std::uint8_t* q;
  float* s;
  float* o;
  void set(int g, float scale, float offset) {
    s[g] = scale;
    o[g] = offset;
  }
};

// Q4_0: d * (q - 8) = d*q - 8d, exactly.
void u8_q4_0(const std::uint8_t* b, Groups out) {
  const float d = f16(b);
  for (int j = 0; j < 16; ++j) {
    out.q[j] = b[2 + j] & 0x0F;
    out.q[j + 16] = b[2 + j] >> 4;
  }
  for (int g = 0; g < 2; ++g) out.set(g, d, -8.0f * d);
}

void u8_q5(const std::uint8_t* b, Groups out, bool with_min) {
  const float d = f16(b), m = with_min ? f16(b + 2) : -16.0f * d;  // Q5_0: d * (q - 16)
  std::uint32_t qh;
  std::memcpy(&qh, b + (with_min ? 4 : 2), 4);
  const std::uint8_t* qs = b + (with_min ? 8 : 6);
  for (int j = 0; j < 16; ++j) {
    out.q[j] = static_cast<std::uint8_t>((qs[j] & 0x0F) | (((qh >> j) & 1u) << 4));
    out.q[j + 16] = static_cast<std::uint8_t>((qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4));
  }
  for (int g = 0; g < 2; ++g) out.set(g, d, m);
}

// Q4_K / Q5_K: sub-blocks of 32 with scale d*sc and offset -dmin*m.
void u8_qk(const std::uint8_t* b, Groups out, bool five) {
  const float d = f16(b), dmin = f16(b + 2);
  const std::uint8_t* scales = b + 4;
  const std::uint8_t* qh = b + 16;
  const std::uint8_t* qs = b + (five ? 48 : 16);
  for (int c = 0; c < 4; ++c)
    for (int half = 0; half < 2; ++half) {
      const auto [sc, mn] = sub_block_scale(2 * c + half, scales, d, dmin);
      for (int l = 0; l < 32; ++l) {
        int q = half ? qs[32 * c + l] >> 4 : qs[32 * c + l] & 0x0F;
        if (five) q |= ((qh[l] >> (2 * c + half)) & 1) << 4;
        out.q[64 * c + 32 * half + l] = static_cast<std::uint8_t>(q);
      }
      out.set(4 * c + 2 * half, sc, -mn);  // sub-block 2c + half is groups 2(2c + half) and the next
      out.set(4 * c + 2 * half + 1, sc, -mn);
    }
}

// Q6_K: (d*S) * (q - 32) = s*q - 32s with s = d*S, groups of 16 each with its own S.
void u8_q6_k(const std::uint8_t* b, Groups out) {
  const std::uint8_t* ql = b;
  const std::uint8_t* qh = b + 128;
  const auto* scales = reinterpret_cast<const std::int8_t*>(b + 192);
  const float d = f16(b + 208);
  for (int n = 0; n < 2; ++n) {
    const std::uint8_t* QL = ql + 64 * n;
    const std::uint8_t* QH = qh + 32 * n;
    std::uint8_t* Q = out.q + 128 * n;
    for (int l = 0; l < 32; ++l) {
      Q[l] = static_cast<std::uint8_t>((QL[l] & 0x0F) | (((QH[l] >> 0) & 3) << 4));
      Q[l + 32] = static_cast<std::uint8_t>((QL[l + 32] & 0x0F) | (((QH[l] >> 2) & 3) << 4));
      Q[l + 64] = static_cast<std::uint8_t>((QL[l] >> 4) | (((QH[l] >> 4) & 3) << 4));
      Q[l + 96] = static_cast<std::uint8_t>((QL[l + 32] >> 4) | (((QH[l] >> 6) & 3) << 4));
    }
    // Element 32*k + l (k = 0..3) uses scale S[l/16 + 2k]: group 2k + l/16 of this half.
    for (int k = 0; k < 4; ++k)
      for (int is = 0; is < 2; ++is) {
        const float sc = d * static_cast<float>(scales[8 * n + is + 2 * k]);
        out.set(8 * n + 2 * k + is, sc, -32.0f * sc);
      }
  }
}

}  // namespace

bool unpacks_to_u8(GgmlType type) {
  switch (type) {
    case GgmlType::Q4_0:
    case GgmlType::Q5_0:
    case GgmlType::Q5_1:
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K:
      return true;
    default:
      return false;
  }
}

void unpack_row_u8(GgmlType type, const std::uint8_t* src, std::int64_t n, std::uint8_t* q, float* s, float* o) {
  if (!unpacks_to_u8(type))
    throw Error("unpack_row_u8: ggml type " + std::to_string(static_cast<std::uint32_t>(type)) +
                " is not a scale-and-offset format");
  const GgmlTypeInfo* info = ggml_type_info(static_cast<std::uint32_t>(type));
  for (std::int64_t b = 0; b < n / info->block; ++b) {
    const std::uint8_t* blk = src + b * info->bytes;
    Groups g{q + b * info->block, s + b * info->block / 16, o + b * info->block / 16};
    switch (type) {
      case GgmlType::Q4_0:
        u8_q4_0(blk, g);
        break;
      case GgmlType::Q5_0:
        u8_q5(blk, g, false);
        break;
      case GgmlType::Q5_1:
        u8_q5(blk, g, true);
        break;
      case GgmlType::Q4_K:
        u8_qk(blk, g, false);
        break;
      case GgmlType::Q5_K:
        u8_qk(blk, g, true);
        break;
      default:
        u8_q6_k(blk, g);
        break;
    }
  }
}

}  // namespace kvsim
