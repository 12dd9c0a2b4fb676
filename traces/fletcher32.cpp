#include "traces/fletcher32.h"

#include <algorithm>

namespace kvsim::h5 {

namespace {

// HDF5 adds big-endian 16-bit words into 32-bit sums, folding the carries back in after every 360
// words (sum2 may wrap modulo 2^32 inside a block first: that wrap is part of the value). Within
// a block sum1 grows by A = sum of the words and sum2 by tlen * sum1 + B with B = sum of
// (tlen - j) * w_j, which a loop without a carried dependence computes; the wrap is then taken
// explicitly, so the result is the library's for every input.
std::uint32_t fold(std::uint32_t x) { return (x & 0xffffu) + (x >> 16); }

}  // namespace

std::uint32_t fletcher32(const std::uint8_t* data, std::size_t len) {
  std::size_t words = len / 2;
  std::uint32_t sum1 = 0, sum2 = 0;
  while (words) {
    const std::size_t tlen = std::min<std::size_t>(words, 360);
    // In 32-bit lanes, which the compiler vectorizes: a <= 360 * 65535 and jw <= 65535 * (0 + ... +
    // 359) < 2^32, so neither wraps.
    std::uint32_t a32 = 0, jw = 0;
    for (std::uint32_t j = 0; j < static_cast<std::uint32_t>(tlen); ++j) {
      const std::uint32_t w = (static_cast<std::uint32_t>(data[2 * j]) << 8) | data[2 * j + 1];
      a32 += w;
      jw += j * w;
    }
    const std::uint64_t a = a32, b = static_cast<std::uint64_t>(tlen) * a - jw;  // sum of (tlen - j) * w_j
    sum2 = static_cast<std::uint32_t>(sum2 + static_cast<std::uint64_t>(tlen) * sum1 + b);
    sum1 = static_cast<std::uint32_t>(sum1 + a);
    sum1 = fold(sum1);
    sum2 = fold(sum2);
    data += 2 * tlen;
    words -= tlen;
  }
  if (len % 2) {  // a last odd byte is the high half of a word
    sum1 += static_cast<std::uint32_t>(*data) << 8;
    sum2 += sum1;
    sum1 = fold(sum1);
    sum2 = fold(sum2);
  }
  return (fold(sum2) << 16) | fold(sum1);
}

bool fletcher32_intact(const std::uint8_t* chunk, std::size_t stored_bytes) {
  if (stored_bytes < kFletcherBytes) return false;
  const std::size_t n = stored_bytes - kFletcherBytes;
  std::uint32_t stored = 0;
  for (std::size_t i = 0; i < kFletcherBytes; ++i) stored |= static_cast<std::uint32_t>(chunk[n + i]) << (8 * i);
  const std::uint32_t sum = fletcher32(chunk, n);
  const std::uint32_t swapped = ((sum & 0x00ff00ffu) << 8) | ((sum >> 8) & 0x00ff00ffu);
  return stored == sum || stored == swapped;
}

void append_fletcher32(std::uint8_t* data, std::size_t len) {
  const std::uint32_t sum = fletcher32(data, len);
  for (std::size_t i = 0; i < kFletcherBytes; ++i) data[len + i] = static_cast<std::uint8_t>(sum >> (8 * i));
}

}  // namespace kvsim::h5
