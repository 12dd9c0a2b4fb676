#include "core/text_lines.h"

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace kvsim {

namespace {

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  for (std::size_t at = 0, end; (end = text.find('\n', at)) != std::string::npos; at = end + 1)
    lines.push_back(text.substr(at, end - at));
  return lines;
}

}  // namespace

std::vector<std::string> whole_lines(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  return split_lines(std::string((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>()));
}

std::vector<std::string> head_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    lines.push_back(line);
    if (line.rfind('#', 0) != 0) break;
  }
  return lines;
}

std::vector<std::string> complete_lines(const std::string& path, const std::string& cut_message) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw Error(path + ": cannot open");
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (!text.empty() && text.back() != '\n') throw FormatError(path + ": " + cut_message);
  return split_lines(text);
}

void for_each_json_line(const std::string& path, const std::string& what, const JsonLineFn& row) {
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot open " + what);
  std::string text;
  std::int64_t line = 0;
  while (std::getline(in, text)) {
    ++line;
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(line);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {  // syntax, and numbers out of range (1e+4111)
      throw FormatError(where + ": not valid JSON (" + e.what() + "); expected " + what);
    }
    if (!j.is_object()) throw FormatError(where + ": not a JSON object; expected " + what);
    row(j, where, line);
  }
}

}  // namespace kvsim
