#include "policies/quantize.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"
#include "core/half.h"

namespace kvsim {

namespace {

float fp16(float x) { return half_to_float(float_to_half(x)); }

// Asymmetric min-max quantization of `n` values at `stride` apart, in place: s = (max - min) /
// (2^b - 1), q = clamp(round((x - min) / s)), x^ = q s + min, with s and min in fp16.
void minmax_group(float* x, std::int64_t n, std::int64_t stride, int bits) {
  float lo = x[0], hi = x[0];
  for (std::int64_t i = 1; i < n; ++i) {
    lo = std::min(lo, x[i * stride]);
    hi = std::max(hi, x[i * stride]);
  }
  const float levels = static_cast<float>((1 << bits) - 1);
  const float scale = fp16((hi - lo) / levels), mn = fp16(lo);
  for (std::int64_t i = 0; i < n; ++i) {
    float& v = x[i * stride];
    const float q = scale > 0 ? std::clamp(std::nearbyint((v - mn) / scale), 0.0f, levels) : 0.0f;
    v = q * scale + mn;
  }
}

// Symmetric absmax: s = max|x| / (2^(b-1) - 1), q = clamp(round(x / s)), x^ = q s.
void absmax_group(float* x, std::int64_t n, int bits) {
  float amax = 0;
  for (std::int64_t i = 0; i < n; ++i) amax = std::max(amax, std::abs(x[i]));
  const float qmax = static_cast<float>((1 << (bits - 1)) - 1);
  const float scale = fp16(amax / qmax);
  for (std::int64_t i = 0; i < n; ++i) x[i] = scale > 0 ? std::clamp(std::nearbyint(x[i] / scale), -qmax, qmax) * scale : 0.0f;
}

// A channel group never spans more than one row: groups wider than head_dim are one per row.
int channel_group(int group, std::int64_t head_dim) { return static_cast<int>(std::min<std::int64_t>(group, head_dim)); }

void check_bits(int bits, const char* what) {
  if (bits != 2 && bits != 4 && bits != 8)
    throw Error(std::string(what) + ": bits = " + std::to_string(bits) + ", expected 2, 4 or 8");
}

}  // namespace

void check_int_spec(const IntSpec& s, int head_dim) {
  check_bits(s.bits, "intN");
  if (s.group <= 0 || head_dim % channel_group(s.group, head_dim) != 0)
    throw Error("intN: group = " + std::to_string(s.group) + " does not divide head_dim " + std::to_string(head_dim));
}

double int_row_bytes(const IntSpec& s, int head_dim) {
  return head_dim * s.bits / 8.0 + static_cast<double>(head_dim / channel_group(s.group, head_dim)) * (s.symmetric ? 2.0 : 4.0);
}

void int_roundtrip(const IntSpec& s, std::span<float> row) {
  const int group = channel_group(s.group, static_cast<std::int64_t>(row.size()));
  for (std::size_t g0 = 0; g0 < row.size(); g0 += static_cast<std::size_t>(group)) {
    float* x = row.data() + g0;
    if (s.symmetric) absmax_group(x, group, s.bits);
    else minmax_group(x, group, 1, s.bits);
  }
}

void check_kivi_spec(const KiviSpec& s, int head_dim) {
  check_bits(s.bits, "kivi");
  if (s.group <= 0 || head_dim % channel_group(s.group, head_dim) != 0)
    throw Error("kivi: group = " + std::to_string(s.group) + " does not divide head_dim " + std::to_string(head_dim));
  if (s.residual < 0 || s.residual % s.group != 0)
    throw Error("kivi: residual = " + std::to_string(s.residual) + " is not a multiple of group " + std::to_string(s.group));
}

std::int64_t kivi_fp16_keys(const KiviSpec& s, std::int64_t n) { return s.residual > 0 ? n % s.residual : 0; }
std::int64_t kivi_fp16_values(const KiviSpec& s, std::int64_t n) { return std::min<std::int64_t>(n, s.residual); }

double kivi_bytes(const KiviSpec& s, int head_dim, std::int64_t n) {
  const double d = head_dim;
  const auto qk = static_cast<double>(n - kivi_fp16_keys(s, n)), qv = static_cast<double>(n - kivi_fp16_values(s, n));
  const double fk = static_cast<double>(kivi_fp16_keys(s, n)), fv = static_cast<double>(kivi_fp16_values(s, n));
  // Keys: d channels x one (s, min) per group of G tokens = 4d/G bytes per quantized token;
  // values: one (s, min) per group of channels of each token.
  const double keys = qk * (d * s.bits / 8.0 + 4.0 * d / s.group) + fk * 2 * d;
  const double values = qv * (d * s.bits / 8.0 + 4.0 * d / channel_group(s.group, head_dim)) + fv * 2 * d;
  return keys + values;
}

void kivi_roundtrip(const KiviSpec& s, int head_dim, std::int64_t n, std::span<float> keys, std::span<float> values) {
  const std::int64_t d = head_dim;
  // Keys: each channel over each group of G tokens of the quantized prefix (a multiple of R,
  // hence of G).
  const std::int64_t qk = n - kivi_fp16_keys(s, n);
  for (std::int64_t t0 = 0; t0 < qk; t0 += s.group)
    for (std::int64_t ch = 0; ch < d; ++ch) minmax_group(keys.data() + t0 * d + ch, s.group, d, s.bits);
  // Values: each token of the quantized prefix over groups of G channels.
  const std::int64_t qv = n - kivi_fp16_values(s, n);
  const int vg = channel_group(s.group, d);
  for (std::int64_t t = 0; t < qv; ++t)
    for (std::int64_t c0 = 0; c0 < d; c0 += vg) minmax_group(values.data() + t * d + c0, vg, 1, s.bits);
}

}  // namespace kvsim
