#include "model/weight_matrix.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cstring>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define KVSIM_QDOT_SIMD 1
#endif

#include "model/dequant.h"
#include "model/gguf.h"
#include "core/error.h"

namespace kvsim {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

const char* weight_format_name(WeightFormat f) { return f == WeightFormat::F32 ? "f32" : "quant"; }

WeightFormat parse_weight_format(const std::string& s) {
  if (s == "f32") return WeightFormat::F32;
  if (s == "quant") return WeightFormat::Quantized;
  throw Error("--weights: '" + s + "' is not a weight format (expected f32 or quant)");
}

struct WeightMatrix::Impl {
  WeightFormat fmt = WeightFormat::F32;
  std::vector<float> f32;              // F32 form: rows x cols
  const std::uint8_t* data = nullptr;  // Quantized form: the tensor's blocks in the mapped file
  GgmlType type = GgmlType::F32;
  std::int64_t row_bytes = 0;
  const std::uint8_t* row_ptr(std::int64_t r) const { return data + r * row_bytes; }
  // Scale-and-offset formats without a block dot (Q5_0, Q4_K, Q6_K, ...) unpacked at load: one
  // byte per weight, an f32 scale and offset per 16 (dequant.h unpack_row_u8).
  std::vector<std::uint8_t> u8;
  std::vector<float> u8_scale, u8_offset;
};

namespace {

// Rows up to this many are multiplied block by block (GEMV); more rows amortise a dequantized
// tile over a GEMM.
constexpr std::int64_t kGemvRows = 4;

#ifdef KVSIM_QDOT_SIMD
float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

float f16_at(const std::uint8_t* p) {
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// Q4_1 block: f16 d, f16 m, 16 bytes of nibbles (low nibbles are elements 0-15, high 16-31);
// w = d*q + m, so sum(w*x) = d*sum(q*x) + m*sum(x), with sum(x) per block precomputed.
float dot_q4_1(const std::uint8_t* w, const float* x, const float* xsum, std::int64_t nb) {
  const __m128i mask = _mm_set1_epi8(0x0F);
  __m256 acc = _mm256_setzero_ps();
  float offset = 0;
  for (std::int64_t b = 0; b < nb; ++b, w += 20, x += 32) {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 4));
    const __m128i lo = _mm_and_si128(q, mask), hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
    __m256 s = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), _mm256_loadu_ps(x));
    s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))), _mm256_loadu_ps(x + 8), s);
    s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), _mm256_loadu_ps(x + 16), s);
    s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))), _mm256_loadu_ps(x + 24), s);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(w)), s, acc);
    offset += f16_at(w + 2) * xsum[b];
  }
  return hsum(acc) + offset;
}

// Q8_0 block: f16 d, 32 int8; w = d*q.
float dot_q8_0(const std::uint8_t* w, const float* x, std::int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  for (std::int64_t b = 0; b < nb; ++b, w += 34, x += 32) {
    const std::uint8_t* q = w + 2;
    __m256 s = _mm256_setzero_ps();
    for (int g = 0; g < 4; ++g) {
      const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8 * g));
      s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)), _mm256_loadu_ps(x + 8 * g), s);
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(w)), s, acc);
  }
  return hsum(acc);
}

// Unpacked groups of 16: w = s*q + o, so sum(w*x) = sum_g s_g*sum(q*x) + o_g*sum(x).
float dot_u8(const std::uint8_t* q, const float* s, const float* o, const float* x, const float* xsum,
             std::int64_t ng) {
  __m256 acc = _mm256_setzero_ps();
  float offset = 0;
  for (std::int64_t g = 0; g < ng; ++g, q += 16, x += 16) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
    const __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
    const __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8)));
    const __m256 part = _mm256_fmadd_ps(hi, _mm256_loadu_ps(x + 8), _mm256_mul_ps(lo, _mm256_loadu_ps(x)));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(s[g]), part, acc);
    offset += o[g] * xsum[g];
  }
  return hsum(acc) + offset;
}
#endif

bool has_block_dot(GgmlType t) {
#ifdef KVSIM_QDOT_SIMD
  return t == GgmlType::Q4_1 || t == GgmlType::Q8_0;
#else
  (void)t;
  return false;
#endif
}

}  // namespace

WeightMatrix::WeightMatrix() = default;
WeightMatrix::WeightMatrix(WeightMatrix&&) noexcept = default;
WeightMatrix& WeightMatrix::operator=(WeightMatrix&&) noexcept = default;
WeightMatrix::~WeightMatrix() = default;

WeightMatrix::WeightMatrix(const GgufFile& f, const std::string& name, std::int64_t rows, std::int64_t cols,
                           WeightFormat fmt)
    : impl_(std::make_unique<Impl>()), rows_(rows), cols_(cols) {
  const GgufTensor& t = f.tensor(name);
  if (t.row_size() != cols || t.rows() != rows)
    throw FormatError(f.path() + ": tensor '" + name + "' has shape [" + std::to_string(t.row_size()) + ", " +
                      std::to_string(t.rows()) + "], expected [" + std::to_string(cols) + ", " + std::to_string(rows) +
                      "]");
  impl_->fmt = fmt;
  impl_->type = t.type;
  if (fmt == WeightFormat::F32 || t.type == GgmlType::F32) {
    impl_->fmt = WeightFormat::F32;
    impl_->f32.resize(static_cast<std::size_t>(rows * cols));
    f.dequantize_rows(t, 0, rows, impl_->f32);
    return;
  }
  // Fail at load, not mid-run, for a type without a dequantizer.
  std::vector<float> probe(static_cast<std::size_t>(cols));
  f.dequantize_rows(t, 0, 1, probe);
  const GgmlTypeInfo* info = ggml_type_info(static_cast<std::uint32_t>(t.type));
  impl_->data = t.data;
  impl_->row_bytes = cols / info->block * info->bytes;
#ifdef KVSIM_QDOT_SIMD
  if (unpacks_to_u8(t.type) && cols % 16 == 0) {
    impl_->u8.resize(static_cast<std::size_t>(rows * cols));
    impl_->u8_scale.resize(static_cast<std::size_t>(rows * cols / 16));
    impl_->u8_offset.resize(impl_->u8_scale.size());
    for (std::int64_t r = 0; r < rows; ++r)
      unpack_row_u8(t.type, impl_->row_ptr(r), cols, impl_->u8.data() + r * cols,
                    impl_->u8_scale.data() + r * cols / 16, impl_->u8_offset.data() + r * cols / 16);
  }
#endif
}

std::size_t WeightMatrix::heap_bytes() const {
  return impl_ ? impl_->f32.size() * sizeof(float) + impl_->u8.size() + 2 * impl_->u8_scale.size() * sizeof(float) : 0;
}

void WeightMatrix::row(std::int64_t r, float* out) const {
  if (r < 0 || r >= rows_)
    throw Error("weight row " + std::to_string(r) + " out of range [0, " + std::to_string(rows_) + ")");
  if (impl_->fmt == WeightFormat::F32)
    std::memcpy(out, impl_->f32.data() + r * cols_, static_cast<std::size_t>(cols_) * sizeof(float));
  else
    dequantize_row(impl_->type, impl_->row_ptr(r), out, cols_);
}

void WeightMatrix::multiply(const float* x, std::int64_t n, float* y) const {
  const Eigen::Map<const RowMat> X(x, n, cols_);
  Eigen::Map<RowMat> Y(y, n, rows_);
  const Impl& w = *impl_;
  if (w.fmt == WeightFormat::F32) {
    Y.noalias() = X * Eigen::Map<const RowMat>(w.f32.data(), rows_, cols_).transpose();
    return;
  }
  if (n <= kGemvRows) {
#ifdef KVSIM_QDOT_SIMD
    if (!w.u8.empty()) {
      const std::int64_t ng = cols_ / 16;
      std::vector<float> xsum(static_cast<std::size_t>(n * ng));
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t g = 0; g < ng; ++g)
          xsum[static_cast<std::size_t>(i * ng + g)] = X.row(i).segment(g * 16, 16).sum();
#pragma omp parallel for schedule(static)
      for (std::int64_t r = 0; r < rows_; ++r)
        for (std::int64_t i = 0; i < n; ++i)
          y[i * rows_ + r] = dot_u8(w.u8.data() + r * cols_, w.u8_scale.data() + r * ng, w.u8_offset.data() + r * ng,
                                    x + i * cols_, xsum.data() + i * ng, ng);
      return;
    }
#endif
    if (has_block_dot(w.type)) {
#ifdef KVSIM_QDOT_SIMD
      const std::int64_t nb = cols_ / 32;
      std::vector<float> xsum(static_cast<std::size_t>(n * nb));
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t b = 0; b < nb; ++b)
          xsum[static_cast<std::size_t>(i * nb + b)] = X.row(i).segment(b * 32, 32).sum();
      const bool q41 = w.type == GgmlType::Q4_1;
#pragma omp parallel for schedule(static)
      for (std::int64_t r = 0; r < rows_; ++r)
        for (std::int64_t i = 0; i < n; ++i)
          y[i * rows_ + r] = q41 ? dot_q4_1(w.row_ptr(r), x + i * cols_, xsum.data() + i * nb, nb)
                                 : dot_q8_0(w.row_ptr(r), x + i * cols_, nb);
#endif
      return;
    }
#pragma omp parallel
    {
      Eigen::VectorXf buf(cols_);
#pragma omp for schedule(static)
      for (std::int64_t r = 0; r < rows_; ++r) {
        dequantize_row(w.type, w.row_ptr(r), buf.data(), cols_);
        for (std::int64_t i = 0; i < n; ++i) y[i * rows_ + r] = X.row(i).dot(buf);
      }
    }
    return;
  }
  // Tiles of ~128 KB of f32 weights, each dequantized once and used by one single-threaded GEMM
  // (Eigen runs serially inside an OpenMP region); threads split the tiles.
  const std::int64_t tile = std::clamp<std::int64_t>((32768 / cols_) / 16 * 16, 16, 256);
  const std::int64_t tiles = (rows_ + tile - 1) / tile;
#pragma omp parallel
  {
    RowMat buf(tile, cols_);
#pragma omp for schedule(dynamic)
    for (std::int64_t t = 0; t < tiles; ++t) {
      const std::int64_t r0 = t * tile, nr = std::min(tile, rows_ - r0);
      for (std::int64_t r = 0; r < nr; ++r) {
        if (w.u8.empty()) {
          dequantize_row(w.type, w.row_ptr(r0 + r), buf.row(r).data(), cols_);
          continue;
        }
        // The unpacked form dequantizes faster than the K-quant blocks: s*q + o per group of 16.
        const std::uint8_t* q = w.u8.data() + (r0 + r) * cols_;
        const float* s = w.u8_scale.data() + (r0 + r) * (cols_ / 16);
        const float* o = w.u8_offset.data() + (r0 + r) * (cols_ / 16);
        float* out = buf.row(r).data();
        for (std::int64_t g = 0; g < cols_ / 16; ++g)
          for (int k = 0; k < 16; ++k) out[g * 16 + k] = s[g] * static_cast<float>(q[g * 16 + k]) + o[g];
      }
      Y.middleCols(r0, nr).noalias() = X * buf.topRows(nr).transpose();
    }
  }
}

}  // namespace kvsim
