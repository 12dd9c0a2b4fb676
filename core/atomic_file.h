#pragma once
// Small output files (JSON summaries, profiles, estimators) are written to PATH.partial and
// renamed into place, so an interrupted run never leaves a half-written file under the real name.
#include <string>

namespace kvsim {

// Writes `text` to `path` that way; throws naming `path` when it cannot be written.
void write_file_atomically(const std::string& path, const std::string& text);

}  // namespace kvsim
