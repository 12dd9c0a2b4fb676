#include "gpu/packed_attention_ref.h"

#include <algorithm>
#include <cmath>

#include "core/half.h"
#include "gpu/transformer_kernels_ref.h"

namespace kvsim::gpu {

namespace {

float fp16(float x) { return half_to_float(float_to_half(x)); }

void put_code(std::uint8_t* row, int i, int bits, unsigned u) {
  const int bit = i * bits;
  row[bit >> 3] = static_cast<std::uint8_t>(row[bit >> 3] | (u << (bit & 7)));
}

}  // namespace

void pack_int_rows(const QuantSpec& s, int d, const float* rows, std::int64_t n, std::uint8_t* codes,
                   std::uint16_t* params) {
  const int rb = s.row_bytes(d), ng = s.groups(d);
  std::fill(codes, codes + n * rb, std::uint8_t{0});
  for (std::int64_t t = 0; t < n; ++t) {
    const float* x = rows + t * d;
    for (int g = 0; g < ng; ++g) {
      const float* xg = x + g * s.group;
      std::uint16_t* pg = params + (t * ng + g) * 2;
      if (s.symmetric) {
        float amax = 0;
        for (int i = 0; i < s.group; ++i) amax = std::max(amax, std::abs(xg[i]));
        const float qmax = static_cast<float>((1 << (s.bits - 1)) - 1);
        const float scale = fp16(amax / qmax);
        pg[0] = float_to_half(scale);
        pg[1] = 0;
        for (int i = 0; i < s.group; ++i) {
          const float q = scale > 0 ? std::clamp(std::nearbyint(xg[i] / scale), -qmax, qmax) : 0.0f;
          put_code(codes + t * rb, g * s.group + i, s.bits, static_cast<unsigned>(q + qmax));
        }
      } else {
        float lo = xg[0], hi = xg[0];
        for (int i = 1; i < s.group; ++i) lo = std::min(lo, xg[i]), hi = std::max(hi, xg[i]);
        const float levels = static_cast<float>((1 << s.bits) - 1);
        const float scale = fp16((hi - lo) / levels), mn = fp16(lo);
        pg[0] = float_to_half(scale);
        pg[1] = float_to_half(mn);
        for (int i = 0; i < s.group; ++i) {
          const float q = scale > 0 ? std::clamp(std::nearbyint((xg[i] - mn) / scale), 0.0f, levels) : 0.0f;
          put_code(codes + t * rb, g * s.group + i, s.bits, static_cast<unsigned>(q));
        }
      }
    }
  }
}

void unpack_int_rows(const QuantSpec& s, int d, const std::uint8_t* codes, const std::uint16_t* params, std::int64_t n,
                     float* rows) {
  const int rb = s.row_bytes(d), ng = s.groups(d);
  for (std::int64_t t = 0; t < n; ++t)
    for (int i = 0; i < d; ++i) {
      const std::uint16_t* pg = params + (t * ng + i / s.group) * 2;
      rows[t * d + i] = dequant(code_at(codes + t * rb, i, s.bits), half_to_float(pg[0]), half_to_float(pg[1]), s);
    }
}

void attend_quant_ref(const AttnShape& s, const QuantSpec& spec, const float* q, const std::uint8_t* k_codes,
                      const std::uint16_t* k_params, const std::uint8_t* v_codes, const std::uint16_t* v_params,
                      const std::int32_t* counts, float* out) {
  const int d = s.head_dim, rb = spec.row_bytes(d), ng = spec.groups(d);
#pragma omp parallel for schedule(dynamic)
  for (int kv = 0; kv < s.n_kv_heads; ++kv) {
    const std::int64_t n = counts[kv], row0 = static_cast<std::int64_t>(kv) * s.capacity;
    std::vector<float> row(static_cast<std::size_t>(d));
    std::vector<double> keys(static_cast<std::size_t>(n * d)), values(keys.size());
    for (std::int64_t m = 0; m < n; ++m)
      for (const bool is_key : {true, false}) {
        const std::uint8_t* codes = (is_key ? k_codes : v_codes) + (row0 + m) * rb;
        const std::uint16_t* params = (is_key ? k_params : v_params) + (row0 + m) * ng * 2;
        unpack_int_rows(spec, d, codes, params, 1, row.data());
        std::copy(row.begin(), row.end(), (is_key ? keys : values).begin() + static_cast<std::ptrdiff_t>(m * d));
      }
    attend_rows_ref(s, kv, q, keys, values, n, out);
  }
}

}  // namespace kvsim::gpu
