#include "core/atomic_file.h"

#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/error.h"

namespace kvsim {

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".partial";
  {
    std::ofstream out(tmp);
    if (!out) throw Error(path + ": cannot write");
    out << text;
    if (!out.flush()) throw Error(path + ": write failed");
  }
  std::filesystem::rename(tmp, path);
}

std::vector<std::string> whole_lines(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  std::vector<std::string> lines;
  for (std::size_t at = 0, end; (end = text.find('\n', at)) != std::string::npos; at = end + 1)
    lines.push_back(text.substr(at, end - at));
  return lines;
}

}  // namespace kvsim
