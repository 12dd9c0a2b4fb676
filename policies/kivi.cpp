// KIVI — Liu et al., ICML 2024, arXiv 2402.02750 (jy-yuan/KIVI quant/new_pack.py, methods.md §12).
// Rule: keys quantized per channel over groups of G tokens, values per token over groups of G
// channels, with an fp16 residual window of R tokens (keys: the n mod R not yet in a full block;
// values: the last R); over budget: sinks + recent, as many as fit.
#include "core/error.h"
#include "policies/codec.h"
#include "policies/quantize.h"
#include "policies/quantized_tier.h"
#include "policies/registry.h"

namespace kvsim {
namespace {

std::int64_t kept_tokens(const HeadPlan& plan) { return plan.kept(); }

class KiviCodec : public KvCodec {
 public:
  explicit KiviCodec(KiviSpec s) : s_(s) {}
  double bytes(const HeadPlan& plan, int d) const override { return kivi_bytes(s_, d, kept_tokens(plan)); }
  void reconstruct(const HeadPlan& plan, const ModelGeometry& g, std::span<const std::int32_t>, std::span<float> keys,
                   std::span<float> values) const override {
    const int d = g.head_dim;
    kivi_roundtrip(s_, d, kept_tokens(plan), keys, values);
  }
  void pack(const HeadPlan& plan, const ModelGeometry& g, std::span<const std::int32_t> positions,
            std::span<const float> keys, std::span<const float> values, PackedEntry& out) const override {
    kivi_pack(s_, g.head_dim, kept_tokens(plan), keys, values, positions, out);
  }

 private:
  KiviSpec s_;
};

class Kivi : public Policy {
 public:
  Kivi(KiviSpec s, int sinks) : codec_(s), spec_(s), sinks_(sinks) {}
  const KvCodec* codec() const override { return &codec_; }
  LayerPlan compress(const LayerSignals& s, const Budget& budget) const override {
    const int d = s.geometry().head_dim;
    check_kivi_spec(spec_, d);
    return fit_every_head(s, budget, sinks_, int_codec(spec_.bits),
                          [&](std::int64_t k) { return kivi_bytes(spec_, d, k); });
  }

 private:
  KiviCodec codec_;
  KiviSpec spec_;
  int sinks_;
};

}  // namespace

KVSIM_REGISTER_POLICY(PolicyInfo{
    "kivi",
    "keys per channel over token groups, values per token, fp16 residual window; over budget: sinks + recent",
    "Liu et al., ICML 2024, arXiv 2402.02750 (jy-yuan/KIVI)",
    {{"bits", "2", "2 | 4 | 8 (KIVI-2 / KIVI-4)"},
     {"group", "32", "tokens per key group and channels per value group (example.py: 32)"},
     {"residual", "32", "fp16 residual window R, a multiple of group (example.py: 32; the paper also uses 128)"},
     {"sinks", "4", "first tokens kept when not every token fits"}},
    [](const Params& p) {
      const KiviSpec s{static_cast<int>(p.integer("bits")), static_cast<int>(p.integer("group")),
                       static_cast<int>(p.integer("residual"))};
      int_codec(s.bits);
      return std::make_unique<Kivi>(s, static_cast<int>(p.integer("sinks")));
    }});

}  // namespace kvsim
