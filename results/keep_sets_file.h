#pragma once
// The owner of the keep-sets file of `kvsim trace keep-sets` (docs/result-files.md): one JSON
// object naming the trace, request and mode, and for each (policy, budget) config the tokens each
// (layer, entry) keeps right after compression.
#include <cstdint>
#include <string>
#include <vector>

namespace kvsim::results {

inline constexpr int kKeepSetsSchema = 2;

struct KeptConfig {
  std::string policy, params, label;
  double budget = 0;
  std::vector<std::vector<std::vector<std::int32_t>>> kept;  // [layer][entry] token indices
};

struct KeepSetsFile {
  int schema = kKeepSetsSchema;
  std::string trace, request, mode;
  std::int64_t tokens = 0, compression_point = 0;
  int layers = 0, layer = -1;  // layer >= 0: `kept` holds that layer only
  std::vector<KeptConfig> configs;
};

std::string keep_sets_text(const KeepSetsFile& f);  // one line of JSON, newline-terminated
// Errors name the file and the field.
KeepSetsFile read_keep_sets_file(const std::string& path);

}  // namespace kvsim::results
