// traces/fletcher32.h against HDF5's Fletcher32 as its documentation defines it: big-endian 16-bit
// words summed a word at a time into 32-bit sums whose carries fold back in after every 360 words.
// Interoperability with the stock library (both ways) is python.h5py_reads_trace's.
#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <vector>

#include "traces/fletcher32.h"

namespace {

std::uint32_t reference_fletcher32(const std::uint8_t* p, std::size_t len) {
  std::uint32_t s1 = 0, s2 = 0;
  std::size_t words = len / 2;
  auto fold = [](std::uint32_t x) { return (x & 0xffffu) + (x >> 16); };
  while (words) {
    std::size_t n = words > 360 ? 360 : words;
    words -= n;
    for (; n; --n, p += 2) {
      s1 += static_cast<std::uint32_t>(p[0]) << 8 | p[1];
      s2 += s1;  // may wrap: the library's arithmetic is 32-bit
    }
    s1 = fold(s1);
    s2 = fold(s2);
  }
  if (len % 2) {
    s1 += static_cast<std::uint32_t>(*p) << 8;
    s2 += s1;
    s1 = fold(s1);
    s2 = fold(s2);
  }
  return fold(s2) << 16 | fold(s1);
}

}  // namespace

TEST_CASE("fletcher32 is HDF5's checksum for every length and content", "[fletcher32]") {
  std::mt19937 gen(3);
  for (const std::size_t len : {0, 1, 2, 3, 4, 100, 719, 720, 721, 722, 1441, 4096, 65536, 1000003}) {
    std::vector<std::uint8_t> data(len);
    for (auto& b : data) b = static_cast<std::uint8_t>(gen());
    INFO("length " << len);
    CHECK(kvsim::h5::fletcher32(data.data(), len) == reference_fletcher32(data.data(), len));
    // All ones: sum2 wraps past 2^32 inside a 360-word block, which the value keeps.
    std::vector<std::uint8_t> ones(len, 0xff), zeros(len, 0);
    CHECK(kvsim::h5::fletcher32(ones.data(), len) == reference_fletcher32(ones.data(), len));
    CHECK(kvsim::h5::fletcher32(zeros.data(), len) == 0u);
  }
  // One flipped bit anywhere changes it.
  std::vector<std::uint8_t> data(4096);
  for (auto& b : data) b = static_cast<std::uint8_t>(gen());
  const std::uint32_t base = kvsim::h5::fletcher32(data.data(), data.size());
  for (std::size_t i = 0; i < data.size(); i += 97) {
    data[i] ^= 0x04;
    CHECK(kvsim::h5::fletcher32(data.data(), data.size()) != base);
    data[i] ^= 0x04;
  }
}
