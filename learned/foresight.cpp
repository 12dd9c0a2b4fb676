// ForesightKV — Li et al., "ForesightKV", arXiv 2602.03203 (RUCAIBox/ForesightKV: a small scorer
// trained with a pairwise hinge loss against the golden eviction label, oracle_golden here).
// Rule: keep each KV head's top tokens by a learned scorer over the token features
// (learned/features.h); trained by `kvsim train foresight`.
#include "learned/scored_policy.h"
#include "policies/registry.h"

namespace kvsim::learned {

KVSIM_REGISTER_POLICY(PolicyInfo{
    "foresight",
    "learned per-token scorer (pairwise ranking against the golden eviction label); keep each head's top tokens",
    "Li et al., ForesightKV, arXiv 2602.03203 (model from kvsim train foresight)", scored_policy_params("foresight"),
    [](const Params& p) { return make_scored_policy("foresight", p); }});

}  // namespace kvsim::learned
