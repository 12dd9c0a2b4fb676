#include "core/atomic_file.h"

#include <filesystem>
#include <fstream>

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

}  // namespace kvsim
