// Seeded random eviction: the control any scoring rule must beat.
// Rule: each (layer, KV head) keeps a uniformly random budget-sized subset.
#include "policies/registry.h"
#include "policies/selection.h"

namespace kvsim {
namespace {

std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

class Random : public ScoringPolicy {
 public:
  explicit Random(std::uint64_t seed) : seed_(seed) {}
  // A hash of (seed, layer, head, token) is an i.i.d. uniform score per token, independent of
  // evaluation order and thread count.
  std::vector<HeadScores> score(const LayerSignals& s) const override {
    std::vector<HeadScores> out(static_cast<std::size_t>(s.geometry().n_kv_heads));
    for (std::size_t h = 0; h < out.size(); ++h) {
      const auto cached = s.cached(static_cast<int>(h));
      out[h].score.resize(cached.size());
      for (std::size_t m = 0; m < cached.size(); ++m) {
        const auto j = static_cast<std::uint64_t>(cached[m]);  // by token, whatever the cache holds
        const std::uint64_t r = mix(mix(mix(seed_ ^ static_cast<std::uint64_t>(s.layer())) ^ h) ^ j);
        out[h].score[m] = static_cast<float>(r >> 40) * 0x1.0p-24f;
      }
    }
    return out;
  }

 private:
  std::uint64_t seed_;
};

}  // namespace

KVSIM_REGISTER_POLICY(PolicyInfo{
    "random",
    "uniformly random keep-set per (layer, KV head); a control",
    "-",
    {{"seed", "0", "random seed (written to the results)"}},
    [](const Params& p) { return std::make_unique<Random>(static_cast<std::uint64_t>(p.integer("seed"))); }});

}  // namespace kvsim
