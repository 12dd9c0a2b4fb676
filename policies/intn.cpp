// Uniform per-token integer quantization — the "simple intN" baseline of methods.md §12 (HF
// QuantizedCache style: per token and head, groups of channels, absmax or min-max, fp16 scales).
// Rule: every cached token's K and V quantized at `bits`; if that exceeds the byte budget, keep
// the sinks and the most recent tokens that fit (no signal spent on choosing).
#include "core/error.h"
#include "policies/codec.h"
#include "policies/quantize.h"
#include "policies/quantized_tier.h"
#include "policies/registry.h"

namespace kvsim {
namespace {

class IntN : public Policy {
 public:
  IntN(IntSpec s, int sinks) : codec_(s), spec_(s), sinks_(sinks) {}
  const KvCodec* codec() const override { return &codec_; }
  LayerPlan compress(const LayerSignals& s, const Budget& budget) const override {
    const int d = s.geometry().head_dim;
    check_int_spec(spec_, d);
    const double per_token = 2 * int_row_bytes(spec_, d);
    return fit_every_head(s, budget, sinks_, int_codec(spec_.bits),
                          [&](std::int64_t k) { return static_cast<double>(k) * per_token; });
  }

 private:
  IntCodec codec_;
  IntSpec spec_;
  int sinks_;
};

}  // namespace

KVSIM_REGISTER_POLICY(PolicyInfo{
    "intn",
    "every token's K and V quantized per token in groups of channels (fp16 scales); over budget: sinks + recent",
    "uniform quantization baseline, methods.md §12 (HF QuantizedCache: nbits=4, q_group_size=64)",
    {{"bits", "4", "2 | 4 | 8"},
     {"group", "64", "channels per scale group (32 | 64 | 128, dividing head_dim)"},
     {"symmetric", "false", "true: absmax, 2 B per group | false: min-max, 4 B per group"},
     {"sinks", "4", "first tokens kept when not every token fits"}},
    [](const Params& p) {
      const IntSpec s{static_cast<int>(p.integer("bits")), static_cast<int>(p.integer("group")),
                      p.boolean("symmetric")};
      int_codec(s.bits);  // names a bad width at parse time
      return std::make_unique<IntN>(s, static_cast<int>(p.integer("sinks")));
    }});

}  // namespace kvsim
