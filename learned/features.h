#pragma once
// The per-token features every learned policy reads, from the same LayerSignals the heuristics
// read, so one extractor serves offline replay, live verify and training. Versioned: a model file
// records the set and version it was trained on and is refused on any other
// (docs/learned.md lists every feature and how it is scaled).
#include <cstdint>
#include <string>
#include <vector>

#include "policies/policy.h"

namespace kvsim::learned {

inline constexpr const char* kFeatureSet = "kvsim-token-features";
inline constexpr int kFeatureVersion = 2;
inline constexpr int kFeatureCount = 20;
// The most recent queries whose attention the window features read (fewer when fewer were
// recorded contiguously up to the compression point).
inline constexpr int kMaxFeatureWindow = 32;

// Feature names in column order (kFeatureCount of them).
const std::vector<std::string>& feature_names();
// The column of a named feature; throws naming it when there is none.
int feature_index(const std::string& name);

// One KV head's features: row-major [tokens, kFeatureCount], tokens in cached() order.
struct HeadFeatures {
  std::vector<float> x;
  std::int64_t tokens = 0;
  const float* row(std::int64_t i) const { return x.data() + i * kFeatureCount; }
};

// The recorded queries contiguous up to the compression point (capped at kMaxFeatureWindow):
// the window the attention features average over. Zero when the last prompt token's query was
// not recorded.
int feature_window(const LayerSignals& s);

// Features of every cached token of KV head kv; the attention features average the GQA group's
// query heads. Throws naming the signals' layer when no query before the compression point was
// recorded (the attention features need at least the last one).
HeadFeatures extract_features(const LayerSignals& s, int kv);

}  // namespace kvsim::learned
