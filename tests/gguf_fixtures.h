#pragma once
// GGUF files built byte by byte, shared by the GGUF reader and weight tests.
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <iterator>
#include <stdexcept>
#include <fstream>
#include <string>
#include <utility>
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
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  return path;
}

// A copy of the GGUF model at `src` with its UINT32 metadata keys `patch` set to other values
// (the tensors stay as they are): fewer layers, a shorter sliding window, ...
inline std::string patched_model(const std::string& src,
                                 const std::vector<std::pair<std::string, std::uint32_t>>& patch,
                                 const std::string& name) {
  std::ifstream in(src, std::ios::binary);
  std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const auto& [key, value] : patch) {
    GgufBytes pattern;
    pattern.str(key).put<std::uint32_t>(4);  // the key, then its type: UINT32
    const auto at = std::search(bytes.begin(), bytes.end(), pattern.b.begin(), pattern.b.end());
    if (at == bytes.end()) throw std::runtime_error(src + ": no UINT32 key " + key);
    std::memcpy(&*(at + static_cast<std::ptrdiff_t>(pattern.b.size())), &value, sizeof(value));
  }
  return write_scratch(name, bytes);
}

// A copy of the GGUF model at `src` that declares only its first layer (`ARCH.block_count`
// patched to 1; the other layers' tensors stay in the file, unread). Its keys, values and
// queries then depend on the tokens alone, never on what a compressed cache did to earlier
// layers: what makes live and offline inputs identical after a compression cut.
inline std::string one_layer_model(const std::string& src, const std::string& arch, const std::string& name) {
  return patched_model(src, {{arch + ".block_count", 1}}, name);
}

}  // namespace kvsim::test
