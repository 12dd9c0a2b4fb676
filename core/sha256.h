#pragma once
// SHA-256 (FIPS 180-4) of a byte string or a file: how model files name the traces they were
// trained on.
#include <cstdint>
#include <string>
#include <string_view>

namespace kvsim {

std::string sha256_hex(std::string_view bytes);
// Streams the file; throws kvsim::Error naming it when it cannot be read.
std::string sha256_file_hex(const std::string& path);

}  // namespace kvsim
