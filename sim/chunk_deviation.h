#pragma once
// How much a chunk's KV depends on what came before it (docs/chunk-states.md), from a trace
// captured with --chunk-states: per layer, each chunk token's relative deviation
// ||(k, v) in one state - (k, v) in context|| / ||(k, v) in context|| (over KV heads), for
//   alone:       the chunk computed after the header only, against the chunk in its request;
//   other_path:  the chunk in context in another request whose path before it differs, keys moved
//                to this request's positions (the state a cache of that request would hold).
// The first chunk of a request alone is in its own state (deviation 0) and is left out of
// `alone`; a chunk's other-path pairs are its first occurrence against each later one.
#include <cstdint>
#include <string>
#include <vector>

namespace kvsim {

class TraceReader;

struct DeviationCurve {
  std::string comparison;  // "alone" | "other_path"
  int layer = 0;
  std::vector<double> deviation;  // per chunk token compared, sorted increasing
  // The share of tokens whose deviation exceeds x.
  double share_above(double x) const;
  double quantile(double q) const;
};

// Every layer's curves of the trace; throws naming the trace when no request has chunk states.
std::vector<DeviationCurve> chunk_deviation(const TraceReader& reader);

}  // namespace kvsim
