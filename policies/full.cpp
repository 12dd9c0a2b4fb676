// The uncompressed cache: the reference every other policy is measured against.
// Rule: keep every token in fp16.
#include "policies/registry.h"
#include "policies/selection.h"

namespace kvsim {
namespace {

class Full : public Policy {
 public:
  LayerPlan compress(const LayerSignals& s, const Budget&) const override {
    LayerPlan plan;
    for (int h = 0; h < s.geometry().n_kv_heads; ++h)
      plan.heads.push_back(plan_from_mask(std::vector<std::uint8_t>(static_cast<std::size_t>(cache_size(s, h)), 1)));
    return plan;
  }
  bool respects_budget() const override { return false; }
};

}  // namespace

KVSIM_REGISTER_POLICY(PolicyInfo{"full", "keep every token (reference; ignores budgets)", "-", {}, [](const Params&) {
                                   return std::make_unique<Full>();
                                 }});

}  // namespace kvsim
