#pragma once
// IEEE 754 binary16 <-> binary32 conversion. Traces store K/V/Q as raw half bits; replay
// converts whole layers at a time, so the bulk routines are vectorised (F16C when the CPU
// has it, chosen once at run time) and the scalar ones are exact for every bit pattern.
#include <cstddef>
#include <cstdint>

namespace kvsim {

float half_to_float(std::uint16_t h);
// Round to nearest even; overflow gives +-inf, NaN stays NaN (quiet, sign kept).
std::uint16_t float_to_half(float f);

void halves_to_floats(const std::uint16_t* src, float* dst, std::size_t n);
void floats_to_halves(const float* src, std::uint16_t* dst, std::size_t n);
// x[i] <- the nearest fp16 value, in place (what an fp16 cache holds of a float).
void round_to_half(float* x, std::size_t n);

// Portable paths, exposed so tests can compare them with the dispatched ones bit for bit.
void halves_to_floats_scalar(const std::uint16_t* src, float* dst, std::size_t n);
void floats_to_halves_scalar(const float* src, std::uint16_t* dst, std::size_t n);
bool half_simd_available();

}  // namespace kvsim
