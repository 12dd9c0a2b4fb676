#include "gpu/attention_ref.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/half.h"

namespace kvsim::gpu {

namespace {

float fp16(float x) { return half_to_float(float_to_half(x)); }

void put_code(std::uint8_t* row, int i, int bits, unsigned u) {
  const int bit = i * bits;
  row[bit >> 3] = static_cast<std::uint8_t>(row[bit >> 3] | (u << (bit & 7)));
}

float half_at(const std::uint16_t* p, std::int64_t i) { return half_to_float(p[i]); }

// Logits to softmax weights, in place.
void softmax(std::vector<double>& logits) {
  if (logits.empty()) return;
  const double mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (double& x : logits) sum += (x = std::exp(x - mx));
  for (double& x : logits) x /= sum;
}

// Attention of each query head of KV head kv over that head's n keys and values, both [n, d]
// doubles: what every reference here does once it has gathered or rebuilt a KV head's rows (once,
// not once per query head: the Mistral-7B shapes have 32768 rows). With `weights` (or null), each
// head's softmax is written at weights[h * stride], zero from n to stride.
void attend_rows_ref(const AttnShape& s, int kv, const float* q, const std::vector<double>& keys,
                     const std::vector<double>& values, std::int64_t n, float* out, float* weights = nullptr,
                     std::int64_t stride = 0) {
  const int d = s.head_dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> w(static_cast<std::size_t>(n));
  for (int h = kv * s.group(); h < (kv + 1) * s.group(); ++h) {
    for (std::int64_t m = 0; m < n; ++m) {
      double dot = 0;
      for (int x = 0; x < d; ++x) dot += static_cast<double>(q[h * d + x]) * keys[static_cast<std::size_t>(m * d + x)];
      w[static_cast<std::size_t>(m)] = dot * scale;
    }
    softmax(w);
    std::vector<double> o(static_cast<std::size_t>(d), 0.0);
    for (std::int64_t m = 0; m < n; ++m)
      for (int x = 0; x < d; ++x) o[static_cast<std::size_t>(x)] += w[static_cast<std::size_t>(m)] * values[static_cast<std::size_t>(m * d + x)];
    for (int x = 0; x < d; ++x) out[h * d + x] = static_cast<float>(o[static_cast<std::size_t>(x)]);
    if (weights)
      for (std::int64_t m = 0; m < stride; ++m)
        weights[h * stride + m] = m < n ? static_cast<float>(w[static_cast<std::size_t>(m)]) : 0.0f;
  }
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

void attend_kept_ref(const AttnShape& s, const float* q, const std::uint16_t* k, const std::uint16_t* v,
                     const std::int32_t* kept, const std::int32_t* counts, int max_kept, float* out, float* weights) {
  const int d = s.head_dim;
  for (int kv = 0; kv < s.n_kv_heads; ++kv) {
    const std::int64_t n = counts[kv], base = static_cast<std::int64_t>(kv) * s.capacity * d;
    const std::int32_t* idx = kept + static_cast<std::int64_t>(kv) * max_kept;
    std::vector<double> keys(static_cast<std::size_t>(n * d)), values(keys.size());
    for (std::int64_t m = 0; m < n; ++m)
      for (int x = 0; x < d; ++x) {
        const std::int64_t at = base + static_cast<std::int64_t>(idx[m]) * d + x;
        keys[static_cast<std::size_t>(m * d + x)] = half_at(k, at);
        values[static_cast<std::size_t>(m * d + x)] = half_at(v, at);
      }
    attend_rows_ref(s, kv, q, keys, values, n, out, weights, max_kept);
  }
}

std::vector<std::int32_t> every_row_kept(int kv_heads, int n) {
  std::vector<std::int32_t> kept(static_cast<std::size_t>(kv_heads) * static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < kept.size(); ++i) kept[i] = static_cast<std::int32_t>(i % static_cast<std::size_t>(n));
  return kept;
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

void attend_lowrank_ref(const AttnShape& s, const RopeShape& rope, const float* q, const std::uint16_t* ck,
                        const std::uint16_t* cv, const std::int32_t* ranks, const std::uint16_t* uk, const std::uint16_t* uv,
                        const std::int32_t* positions, const float* rope_cos, const float* rope_sin,
                        const std::int32_t* counts, float* out) {
  const int d = s.head_dim, pairs = rope.rope_dim / 2;
#pragma omp parallel for schedule(dynamic)
  for (int kv = 0; kv < s.n_kv_heads; ++kv) {
    const std::int64_t n = counts[kv], row0 = static_cast<std::int64_t>(kv) * s.capacity;
    const std::uint16_t* U = uk + static_cast<std::int64_t>(kv) * d * d;
    const std::uint16_t* V = uv + static_cast<std::int64_t>(kv) * d * d;
    // Keys rebuilt from their rank coefficients and rotated to their position; values rebuilt
    // the same way (no rotation), the rank mask applied per token.
    std::vector<double> keys(static_cast<std::size_t>(n * d)), values(keys.size());
    for (std::int64_t m = 0; m < n; ++m) {
      const int r = ranks[row0 + m];
      const std::uint16_t* c = ck + (row0 + m) * d;
      const std::uint16_t* cvm = cv + (row0 + m) * d;
      double* key = keys.data() + m * d;
      double* value = values.data() + m * d;
      for (int x = 0; x < d; ++x) {
        double acc = 0, vacc = 0;
        for (int j = 0; j < r; ++j) {
          acc += half_to_float(c[j]) * static_cast<double>(half_to_float(U[x * d + j]));
          vacc += half_to_float(cvm[j]) * static_cast<double>(half_to_float(V[x * d + j]));
        }
        key[x] = acc;
        value[x] = vacc;
      }
      const float* cs = rope_cos + static_cast<std::int64_t>(positions[m]) * pairs;
      const float* sn = rope_sin + static_cast<std::int64_t>(positions[m]) * pairs;
      for (int i = 0; i < pairs; ++i) {
        const int a = rope.first(i), b = rope.second(i);
        const double x0 = key[a], x1 = key[b];
        key[a] = x0 * cs[i] - x1 * sn[i];
        key[b] = x0 * sn[i] + x1 * cs[i];
      }
    }
    attend_rows_ref(s, kv, q, keys, values, n, out);
  }
}

void column_sums_ref(const float* weights, int heads, int rows, int n, float* sums) {
  for (int h = 0; h < heads; ++h)
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int r = 0; r < rows; ++r) s += weights[(static_cast<std::int64_t>(h) * rows + r) * n + j];
      sums[static_cast<std::int64_t>(h) * n + j] = static_cast<float>(s);
    }
}

void top_k_ref(const float* scores, const std::uint8_t* protect, int heads, int n, int k, std::uint8_t* keep) {
  std::vector<int> order(static_cast<std::size_t>(n));
  for (int h = 0; h < heads; ++h) {
    const float* sc = scores + static_cast<std::int64_t>(h) * n;
    const std::uint8_t* pr = protect ? protect + static_cast<std::int64_t>(h) * n : nullptr;
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int b) {
      return keep_key(sc[a], static_cast<std::uint32_t>(a), pr && pr[a]) > keep_key(sc[b], static_cast<std::uint32_t>(b), pr && pr[b]);
    });
    std::uint8_t* kp = keep + static_cast<std::int64_t>(h) * n;
    std::fill(kp, kp + n, std::uint8_t{0});
    for (int i = 0; i < std::min(k, n); ++i) kp[order[static_cast<std::size_t>(i)]] = 1;
  }
}

double nmse(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size() || b.empty()) return std::numeric_limits<double>::infinity();
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return den > 0 ? num / den : num;
}

}  // namespace kvsim::gpu
