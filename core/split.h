#pragma once
// Splits an option value at `sep`, dropping empty parts ("a,,b" -> a, b). Shared by the kvsim
// command and kvsim-parity (which the GPU-only build links without cli/).
#include <algorithm>
#include <string>
#include <vector>

namespace kvsim {

inline std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= s.size()) {
    const std::size_t end = std::min(s.find(sep, start), s.size());
    if (end > start) out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

}  // namespace kvsim
