#include "policies/base_scorer.h"

#include <algorithm>

#include "core/error.h"
#include "policies/registry.h"
#include "policies/selection.h"

namespace kvsim {

std::unique_ptr<Policy> make_base_scorer(const std::string& base_param, const std::string& wrapper) {
  std::string spec = base_param;
  if (const auto slash = spec.find('/'); slash != std::string::npos) {
    spec[slash] = ':';
    std::replace(spec.begin() + static_cast<std::ptrdiff_t>(slash), spec.end(), '/', ',');
  }
  PolicyInstance base = PolicyRegistry::instance().create(spec);
  const auto* scorer = dynamic_cast<const ScoringPolicy*>(base.policy.get());
  if (!scorer)
    throw Error("policy " + wrapper + ": parameter 'base' = '" + base_param +
                "' is not a scoring policy (it must rank tokens by a score)");
  if (!scorer->selection_is_uniform())
    throw Error("policy " + wrapper + ": parameter 'base' = '" + base_param +
                "' selects by more than its scores (layer budgets, budget-dependent windows or decode-time "
                "eviction) and " +
                wrapper +
                " would drop that part; use a one-shot scoring policy such as snapkv, "
                "expected_attention or tova:phase=prefill");
  return std::move(base.policy);
}

}  // namespace kvsim
