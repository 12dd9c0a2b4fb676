#include "policies/quantize.h"

#include <algorithm>
#include <cmath>
#include <string>

#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "core/packed_kv.h"

namespace kvsim {

namespace {

float fp16(float x) { return half_to_float(float_to_half(x)); }

// What one quantized group stores: its codes (unsigned, one per value) and fp16 (scale, min).
struct GroupCodes {
  unsigned* u = nullptr;  // n codes, or null when only the read-back is wanted
  float scale = 0, mn = 0;
};

// Asymmetric min-max quantization of `n` values at `stride` apart, in place: s = (max - min) /
// (2^b - 1), q = clamp(round((x - min) / s)), x^ = q s + min, with s and min in fp16.
void minmax_group(float* x, std::int64_t n, std::int64_t stride, int bits, GroupCodes* codes = nullptr) {
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
    if (codes) codes->u[i] = static_cast<unsigned>(q);
  }
  if (codes) codes->scale = scale, codes->mn = mn;
}

// Symmetric absmax: s = max|x| / (2^(b-1) - 1), q = clamp(round(x / s)), x^ = q s (stored as
// the unsigned code q + qmax).
void absmax_group(float* x, std::int64_t n, int bits, GroupCodes* codes = nullptr) {
  float amax = 0;
  for (std::int64_t i = 0; i < n; ++i) amax = std::max(amax, std::abs(x[i]));
  const float qmax = static_cast<float>((1 << (bits - 1)) - 1);
  const float scale = fp16(amax / qmax);
  for (std::int64_t i = 0; i < n; ++i) {
    const float q = scale > 0 ? std::clamp(std::nearbyint(x[i] / scale), -qmax, qmax) : 0.0f;
    x[i] = q * scale;
    if (codes) codes->u[i] = static_cast<unsigned>(q + qmax);
  }
  if (codes) codes->scale = scale, codes->mn = 0.0f;
}

// A channel group never spans more than one row: groups wider than head_dim are one per row.
int channel_group(int group, std::int64_t head_dim) {
  return static_cast<int>(std::min<std::int64_t>(group, head_dim));
}

void check_bits(int bits, const char* what) {
  if (bits != 2 && bits != 4 && bits != 8)
    throw Error(std::string(what) + ": bits = " + std::to_string(bits) + ", expected 2, 4 or 8");
}

// Appends n codes of `bits` bits, value i at bit i * bits (bits divides 8: no code spans bytes);
// returns the first byte's offset.
std::int64_t append_codes(std::vector<std::uint8_t>& out, const unsigned* u, std::int64_t n, int bits) {
  const auto first = static_cast<std::int64_t>(out.size());
  out.resize(out.size() + static_cast<std::size_t>((n * bits + 7) / 8), 0);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t bit = i * bits;
    out[static_cast<std::size_t>(first + bit / 8)] |= static_cast<std::uint8_t>(u[i] << (bit % 8));
  }
  return first;
}

void push_pair(PackedTensor& t, const GroupCodes& g) {
  t.params.push_back(float_to_half(g.scale));
  t.params.push_back(float_to_half(g.mn));
}

// A tensor's quantized rows share one layout: set it on the first, hold later ones to it.
void set_layout(PackedTensor& t, int bits, int param_span, bool symmetric, const char* what) {
  const bool has_quant = !t.codes.empty();
  if (has_quant && (t.bits != bits || t.param_span != param_span || t.symmetric != symmetric))
    throw Error(std::string(what) + ": a packed tensor holds one quantized layout (bits " + std::to_string(t.bits) +
                ", span " + std::to_string(t.param_span) + "), not also bits " + std::to_string(bits) + ", span " +
                std::to_string(param_span));
  t.bits = bits, t.param_span = param_span, t.symmetric = symmetric;
}

}  // namespace

void check_int_spec(const IntSpec& s, int head_dim) {
  check_bits(s.bits, "intN");
  if (s.group <= 0 || head_dim % channel_group(s.group, head_dim) != 0)
    throw Error("intN: group = " + std::to_string(s.group) + " does not divide head_dim " + std::to_string(head_dim));
}

double int_row_bytes(const IntSpec& s, int head_dim) {
  return head_dim * s.bits / 8.0 +
         static_cast<double>(head_dim / channel_group(s.group, head_dim)) * (s.symmetric ? 2.0 : 4.0);
}

void int_roundtrip(const IntSpec& s, std::span<float> row) {
  const int group = channel_group(s.group, static_cast<std::int64_t>(row.size()));
  for (std::size_t g0 = 0; g0 < row.size(); g0 += static_cast<std::size_t>(group)) {
    float* x = row.data() + g0;
    if (s.symmetric)
      absmax_group(x, group, s.bits);
    else
      minmax_group(x, group, 1, s.bits);
  }
}

void int_pack_row(const IntSpec& s, std::span<const float> row, std::int32_t position, PackedTensor& t) {
  const auto d = static_cast<std::int64_t>(row.size());
  const int group = channel_group(s.group, d);
  set_layout(t, s.bits, group, s.symmetric, "intN");
  thread_local std::vector<float> x;
  thread_local std::vector<unsigned> u;
  x.assign(row.begin(), row.end());
  u.assign(row.size(), 0);
  PackedRow r;
  r.kind = PackedKind::Quant;
  r.position = position;
  r.param = static_cast<std::int64_t>(t.params.size() / 2);
  for (std::int64_t g0 = 0; g0 < d; g0 += group) {
    GroupCodes gc{u.data() + g0};
    if (s.symmetric)
      absmax_group(x.data() + g0, group, s.bits, &gc);
    else
      minmax_group(x.data() + g0, group, 1, s.bits, &gc);
    push_pair(t, gc);
  }
  r.data = append_codes(t.codes, u.data(), d, s.bits);
  t.rows.push_back(r);
}

void check_kivi_spec(const KiviSpec& s, int head_dim) {
  check_bits(s.bits, "kivi");
  if (s.group <= 0 || head_dim % channel_group(s.group, head_dim) != 0)
    throw Error("kivi: group = " + std::to_string(s.group) + " does not divide head_dim " + std::to_string(head_dim));
  if (s.residual < 0 || s.residual % s.group != 0)
    throw Error("kivi: residual = " + std::to_string(s.residual) + " is not a multiple of group " +
                std::to_string(s.group));
}

// Without a residual window, keys still quantize only in whole token groups (a partial group has
// no per-channel statistics yet): the n mod G newest stay fp16.
std::int64_t kivi_fp16_keys(const KiviSpec& s, std::int64_t n) { return n % (s.residual > 0 ? s.residual : s.group); }
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

void kivi_pack(const KiviSpec& s, int head_dim, std::int64_t n, std::span<const float> keys,
               std::span<const float> values, std::span<const std::int32_t> positions, PackedEntry& out) {
  check_kivi_spec(s, head_dim);
  const std::int64_t d = head_dim;
  if (static_cast<std::int64_t>(positions.size()) != n || static_cast<std::int64_t>(keys.size()) != n * d ||
      static_cast<std::int64_t>(values.size()) != n * d)
    throw Error("kivi: pack of " + std::to_string(n) + " tokens got " + std::to_string(positions.size()) +
                " positions and " + std::to_string(keys.size()) + " / " + std::to_string(values.size()) +
                " key / value floats");
  out = PackedEntry{};
  out.head_dim = head_dim;
  PackedTensor& k = out.k;
  set_layout(k, s.bits, 1, false, "kivi");
  // Keys: one group of G tokens quantizes channel by channel; its G rows read one run of d pairs.
  const std::int64_t qk = n - kivi_fp16_keys(s, n);
  std::vector<float> block(static_cast<std::size_t>(s.group * d));
  std::vector<unsigned> column(static_cast<std::size_t>(s.group)), codes(static_cast<std::size_t>(s.group * d));
  for (std::int64_t t0 = 0; t0 < qk; t0 += s.group) {
    std::copy_n(keys.data() + t0 * d, s.group * d, block.data());
    const auto base = static_cast<std::int64_t>(k.params.size() / 2);
    for (std::int64_t ch = 0; ch < d; ++ch) {
      GroupCodes gc{column.data()};
      minmax_group(block.data() + ch, s.group, d, s.bits, &gc);
      push_pair(k, gc);
      for (int i = 0; i < s.group; ++i)
        codes[static_cast<std::size_t>(i * d + ch)] = column[static_cast<std::size_t>(i)];
    }
    for (int i = 0; i < s.group; ++i) {
      PackedRow r;
      r.kind = PackedKind::Quant;
      r.position = positions[static_cast<std::size_t>(t0 + i)];
      r.param = base;
      r.data = append_codes(k.codes, codes.data() + i * d, d, s.bits);
      k.rows.push_back(r);
    }
  }
  for (std::int64_t t = qk; t < n; ++t)
    pack_fp16_row(k, keys.data() + t * d, head_dim, positions[static_cast<std::size_t>(t)]);
  // Values: per token over channel groups, as intN stores them; the last min(n, R) stay fp16.
  const std::int64_t qv = n - kivi_fp16_values(s, n);
  const IntSpec vs{s.bits, s.group, false};
  for (std::int64_t t = 0; t < qv; ++t)
    int_pack_row(vs, values.subspan(static_cast<std::size_t>(t * d), static_cast<std::size_t>(d)),
                 positions[static_cast<std::size_t>(t)], out.v);
  for (std::int64_t t = qv; t < n; ++t)
    pack_fp16_row(out.v, values.data() + t * d, head_dim, positions[static_cast<std::size_t>(t)]);
}

}  // namespace kvsim
