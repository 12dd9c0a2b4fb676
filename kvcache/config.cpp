#include "kvcache/config.h"

#include <algorithm>

#include "core/error.h"

namespace kvsim {

const char* mode_name(ReplayMode m) { return m == ReplayMode::QueryAware ? "query-aware" : "query-agnostic"; }

ReplayMode parse_mode(const std::string& s) {
  if (s == "query-aware") return ReplayMode::QueryAware;
  if (s == "query-agnostic") return ReplayMode::QueryAgnostic;
  throw Error("--mode is '" + s + "', expected query-aware or query-agnostic");
}

std::vector<std::int64_t> compression_cuts(std::int64_t c, std::int64_t every) {
  if (every < 0) throw Error("--compress-every must be >= 0 (0: compress once, at the compression point)");
  std::vector<std::int64_t> cuts;
  if (every > 0)
    for (std::int64_t b = every; b < c; b += every) cuts.push_back(b);
  cuts.push_back(c);
  return cuts;
}

}  // namespace kvsim
