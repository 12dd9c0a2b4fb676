#pragma once
// GGUF files built byte by byte, shared by the GGUF reader and weight tests.
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "trace_fixtures.h"

namespace kvsim::test {

struct GgufBytes {
  std::vector<std::uint8_t> b;
  template <typename T>
  GgufBytes& put(T v) {
    const std::size_t at = b.size();
    b.resize(at + sizeof(T));  // resize + memcpy: GCC 12 misreports insert() of a few bytes
    std::memcpy(b.data() + at, &v, sizeof(T));
    return *this;
  }
  GgufBytes& str(const std::string& s) {
    put<std::uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  GgufBytes& pad(std::size_t align) {
    while (b.size() % align) b.push_back(0);
    return *this;
  }
};

inline std::string write_scratch(const std::string& name, const std::vector<std::uint8_t>& bytes) {
  const std::string path = scratch_file(name);
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                              static_cast<std::streamsize>(bytes.size()));
  return path;
}

}  // namespace kvsim::test
