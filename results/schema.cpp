#include "results/schema.h"

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

}  // namespace kvsim::results
