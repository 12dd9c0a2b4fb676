// The serving simulator's speed (issue 26): hit-rate-only replay of a Mooncake trace, in block
// references per second on one core per eviction policy at several capacities (target >= 20 M/s),
// and its cost when the trace is replicated 4x and 16x (ratios of time, expected ~4 and ~16).
// Each figure is the best of 5 runs, measured side by side in this process.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "core/error.h"
#include "serve/hit_rate.h"

using namespace kvsim;
using namespace kvsim::serve;

namespace {

double best_seconds(const BlockTree& tree, std::int64_t capacity, Eviction kind, HitRateResult* last) {
  double best = 1e30;
  EvictionOptions o;
  o.kind = kind;
  for (int rep = 0; rep < 5; ++rep) {
    const HitRateResult r = hit_rate(tree, capacity, o);
    best = std::min(best, r.seconds);
    if (last) *last = r;
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : "../shared/data/mooncake/synthetic_trace.jsonl";
  try {
    const RequestTrace trace = read_mooncake_trace(path);
    const BlockTree tree(trace);
    const auto distinct = static_cast<std::int64_t>(trace.blocks());
    std::printf("serve benchmark: %s, %zu requests, %lld block references, %lld distinct blocks\n", path.c_str(),
                trace.requests.size(), static_cast<long long>(trace.block_references()), static_cast<long long>(distinct));
    std::printf("%-15s %10s %10s %12s\n", "eviction", "capacity", "block hit", "Mrefs/s");
    double worst_lru = 1e30, worst_other = 1e30;
    for (const std::string& name : eviction_names())
      for (const std::int64_t cap : {std::max<std::int64_t>(1, distinct / 40), std::max<std::int64_t>(1, distinct / 4),
                                     std::max<std::int64_t>(1, distinct / 2)}) {
        HitRateResult r;
        const double s = best_seconds(tree, cap, parse_eviction(name), &r);
        const double rate = static_cast<double>(r.block_refs) / s / 1e6;
        (name == "lru" ? worst_lru : worst_other) = std::min(name == "lru" ? worst_lru : worst_other, rate);
        std::printf("%-15s %10lld %10.4f %12.1f\n", name.c_str(), static_cast<long long>(cap), r.block_hit_rate(), rate);
      }
    std::printf("hit-rate replay, LRU: slowest %.1f M block references/s on one core (target >= 20) %s; the other "
                "policies: slowest %.1f M/s %s\n",
                worst_lru, worst_lru >= 20 ? "OK" : "BELOW TARGET", worst_other, worst_other >= 20 ? "OK" : "BELOW TARGET");
    // Cost growth: the same capacity share of each replicated trace's blocks.
    for (const std::string name : {"lru", "rppc"}) {
      const double one = best_seconds(tree, std::max<std::int64_t>(1, distinct / 4), parse_eviction(name), nullptr);
      std::printf("%s, capacity = distinct/4, trace replicated:", name.c_str());
      for (const int times : {4, 16}) {
        const RequestTrace big = replicate(trace, times);
        const BlockTree big_tree(big);
        const double t = best_seconds(big_tree, std::max<std::int64_t>(1, static_cast<std::int64_t>(big.blocks()) / 4), parse_eviction(name), nullptr);
        std::printf("  %dx: %.2fx the time", times, t / one);
      }
      std::printf("  (linear: 4x, 16x)\n");
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_serve: %s\n", e.what());
    return 1;
  }
  return 0;
}
