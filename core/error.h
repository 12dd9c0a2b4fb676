#pragma once
// Errors that reach the user. Every message names the file, the field and what was expected,
// so a bad input can be fixed without reading our source.
#include <stdexcept>
#include <string>

namespace kvsim {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Raised for input that violates a documented format (trace, config, model file).
class FormatError : public Error {
 public:
  using Error::Error;
};

}  // namespace kvsim
