#pragma once
// Small output files (JSON summaries, profiles, estimators) are written to PATH.partial and
// renamed into place, so an interrupted run never leaves a half-written file under the real name.
#include <string>
#include <vector>

namespace kvsim {

// Writes `text` to `path` that way; throws naming `path` when it cannot be written.
void write_file_atomically(const std::string& path, const std::string& text);

// The other side: result files that grow a flushed line at a time (sweep rows, serving grids'
// progress) and may have been cut by a kill. Their newline-terminated lines; an unterminated last
// line (what the kill cut, even if it looks whole) is left out. A missing file has none.
std::vector<std::string> whole_lines(const std::string& path);

}  // namespace kvsim
