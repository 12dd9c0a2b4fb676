#pragma once
// fp16 as tests/cuda_emu's kernels see it: the bits, converted by the project's own exact
// routines (core/half.h), which round to nearest even as the device does.
#include <cstdint>

#include "core/half.h"
#include "cuda_runtime.h"

struct __half_raw {
  std::uint16_t x = 0;
};
struct __half {
  std::uint16_t x = 0;
  __half() = default;
  __half(__half_raw r) : x(r.x) {}
};
struct __half2 {
  __half x, y;
};
inline float __half2float(__half h) { return kvsim::half_to_float(h.x); }
inline __half __float2half_rn(float f) {
  __half h;
  h.x = kvsim::float_to_half(f);
  return h;
}
inline __half __ushort_as_half(std::uint16_t u) {
  __half h;
  h.x = u;
  return h;
}
inline std::uint16_t __half_as_ushort(__half h) { return h.x; }
inline float2 __half22float2(__half2 h) { return float2{__half2float(h.x), __half2float(h.y)}; }
