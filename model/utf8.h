#pragma once
// UTF-8 lengths, shared by the tokenizers.
#include <cstddef>

namespace kvsim {

// Length of the UTF-8 sequence starting with byte c (1 for stray continuation bytes).
inline std::size_t utf8_len(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c >> 5) == 0x6) return 2;
  if ((c >> 4) == 0xE) return 3;
  if ((c >> 3) == 0x1E) return 4;
  return 1;
}

}  // namespace kvsim
