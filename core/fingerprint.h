#pragma once
// A prompt's fingerprint: FNV-1a (64 bit) over its token ids. Learned-policy model files record
// the fingerprints of their training prompts, so sweeps (from a trace) and live verify (from a
// tokenized request) recognise them whatever the request is called.
#include <cstdint>
#include <span>

namespace kvsim {

inline std::uint64_t prompt_fingerprint(std::span<const std::int32_t> tokens) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (std::int32_t t : tokens)
    for (int b = 0; b < 4; ++b) {
      h ^= (static_cast<std::uint32_t>(t) >> (8 * b)) & 0xffu;
      h *= 0x100000001b3ull;
    }
  return h;
}

}  // namespace kvsim
