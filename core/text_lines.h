#pragma once
// Reading files kvsim writes a line at a time: the one place that splits a file into lines and
// parses JSON Lines, so every reader treats a line cut by a kill the same way.
#include <cstdint>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace kvsim {

// Result files that grow a flushed line at a time (sweep rows, serving grids' progress) may have
// been cut by a kill. Their newline-terminated lines; an unterminated last line (what the kill
// cut, even if it looks whole) is left out. A missing file has none.
std::vector<std::string> whole_lines(const std::string& path);

// Every line of a file that must be whole: throws "PATH: <cut_message>" when its last line has no
// newline, and names PATH when it cannot be opened.
std::vector<std::string> complete_lines(const std::string& path, const std::string& cut_message);

// A result file's head, read without reading the rest: its leading '#' lines, then the first line
// after them (a CSV's column names; absent when the file has none). A missing file has none.
std::vector<std::string> head_lines(const std::string& path);

// JSON Lines: calls `row` with each non-blank line's object, "PATH:LINE" and the line number. A line
// that is not a JSON object throws FormatError naming PATH:LINE and `what` the file should be.
using JsonLineFn = std::function<void(const nlohmann::json& j, const std::string& where, std::int64_t line)>;
void for_each_json_line(const std::string& path, const std::string& what, const JsonLineFn& row);

}  // namespace kvsim
