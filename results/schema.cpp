#include "results/schema.h"

#include <fstream>

#include "core/error.h"

namespace kvsim::results {

void check_schema(int found, int current, const std::string& path, const std::string& kind) {
  if (found >= 1 && found <= current) return;
  throw FormatError(path + ": a " + kind + " of schema " + std::to_string(found) +
                    ", but this kvsim reads schema 1 to " + std::to_string(current) +
                    (found > current ? " (written by a newer kvsim; update kvsim)" : ""));
}

int banner_schema(const std::string& banner, const std::string& prefix, const std::string& path) {
  const std::string tag = prefix + " (schema ";
  if (banner.rfind(tag, 0) != 0) return 1;
  std::size_t used = 0;
  int n = 0;
  try {
    n = std::stoi(banner.substr(tag.size()), &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || banner.compare(tag.size() + used, 1, ")") != 0)
    throw FormatError(path + ":1: '" + banner + "': expected '" + tag + "N)'");
  return n;
}

std::string banner_with_schema(const std::string& prefix, int schema) {
  return prefix + " (schema " + std::to_string(schema) + ")";
}

namespace {
const std::string kConfigTag = "# config: ";
}  // namespace

std::string config_line(const std::string& json) { return kConfigTag + json; }
bool is_config_line(const std::string& line) { return line.rfind(kConfigTag, 0) == 0; }
std::string config_json(const std::string& line) { return line.substr(kConfigTag.size()); }

Banner read_banner(const std::string& path, const std::string& prefix, const std::string& kind, int current) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) throw Error(path + ": cannot open; expected a " + kind);
  if (line.rfind(prefix, 0) != 0)
    throw FormatError(path + ":1: '" + line.substr(0, 60) + "', expected a " + kind + " ('" + prefix + " ...')");
  Banner b;
  b.schema = banner_schema(line, prefix, path);
  check_schema(b.schema, current, path, kind);
  const auto colon = line.find(": ");
  if (colon != std::string::npos) b.rest = line.substr(colon + 2);
  return b;
}

}  // namespace kvsim::results
