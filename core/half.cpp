#include "core/half.h"

#include <bit>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define KVSIM_X86 1
#endif

namespace kvsim {

float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf / NaN with payload kept
    if (mant != 0) bits |= 0x00400000u;        // quiet a signalling NaN, as F16C does
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {
    // Subnormal half: normalise into a float exponent.
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    bits = sign | (static_cast<std::uint32_t>(112 - e) << 23) | ((mant & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

std::uint16_t float_to_half(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN
    if (abs == 0x7f800000u) return sign | 0x7c00u;
    return static_cast<std::uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  }
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: overflow to inf
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero) in half: shift the implicit-1 mantissa right, RNE.
    if (abs < 0x33000000u) return sign;  // below half of the smallest subnormal
    const std::uint32_t e = abs >> 23;
    const std::uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - e;  // 14..24
    std::uint32_t r = m >> shift;
    const std::uint32_t rem = m & ((1u << shift) - 1u);
    const std::uint32_t halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (r & 1u))) ++r;
    return static_cast<std::uint16_t>(sign | r);
  }
  std::uint32_t r = (abs - 0x38000000u) >> 13;  // rebias exponent 127 -> 15
  const std::uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return static_cast<std::uint16_t>(sign | r);
}

void halves_to_floats_scalar(const std::uint16_t* src, float* dst, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = half_to_float(src[i]);
}

void floats_to_halves_scalar(const float* src, std::uint16_t* dst, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = float_to_half(src[i]);
}

#ifdef KVSIM_X86
namespace {

__attribute__((target("avx,f16c"))) void halves_to_floats_f16c(const std::uint16_t* src, float* dst, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) dst[i] = half_to_float(src[i]);
}

__attribute__((target("avx,f16c"))) void floats_to_halves_f16c(const float* src, std::uint16_t* dst, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  for (; i < n; ++i) dst[i] = float_to_half(src[i]);
}

// CPUID directly: clang's __builtin_cpu_supports does not know "f16c". AVX also needs the OS to
// save the YMM registers (OSXSAVE, then XCR0 bits 1 and 2).
bool detect_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  const bool osxsave = c & (1u << 27), avx = c & (1u << 28), f16c = c & (1u << 29);
  if (!(osxsave && avx && f16c)) return false;
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & 6u) == 6u;
}

}  // namespace

bool half_simd_available() {
  static const bool ok = detect_f16c();
  return ok;
}

void halves_to_floats(const std::uint16_t* src, float* dst, std::size_t n) {
  if (half_simd_available()) return halves_to_floats_f16c(src, dst, n);
  halves_to_floats_scalar(src, dst, n);
}

void floats_to_halves(const float* src, std::uint16_t* dst, std::size_t n) {
  if (half_simd_available()) return floats_to_halves_f16c(src, dst, n);
  floats_to_halves_scalar(src, dst, n);
}
#else
bool half_simd_available() { return false; }
void halves_to_floats(const std::uint16_t* src, float* dst, std::size_t n) { halves_to_floats_scalar(src, dst, n); }
void floats_to_halves(const float* src, std::uint16_t* dst, std::size_t n) { floats_to_halves_scalar(src, dst, n); }
#endif

void round_to_half(float* x, std::size_t n) {
  constexpr std::size_t chunk = 512;
  std::uint16_t h[chunk];
  for (std::size_t b = 0; b < n; b += chunk) {
    const std::size_t len = n - b < chunk ? n - b : chunk;
    floats_to_halves(x + b, h, len);
    halves_to_floats(h, x + b, len);
  }
}

}  // namespace kvsim
