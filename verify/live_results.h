#pragma once
// Reading a `kvsim verify` result CSV back: the live side of `kvsim calibrate` and
// `kvsim agreement`. Errors name the file, line and column.
#include <string>
#include <vector>

#include "verify/agreement.h"

namespace kvsim {

struct LiveResults {
  std::string mode;       // every row's (a file of several modes is refused)
  std::string semantics;  // every row's budget_semantics (empty in older files)
  std::vector<LiveRow> rows;
};

// Records may span lines (the generated text is quoted and can hold newlines).
LiveResults read_verify_csv(const std::string& path);

}  // namespace kvsim
