#pragma once
// SnapKV's observation-window scores, shared by snapkv, pyramidkv and (through them) adakv.
#include "policies/params.h"
#include "policies/selection.h"

namespace kvsim {

struct SnapKvOptions {
  int window = 32;
  int kernel = 5;
  PoolKind pool = PoolKind::Avg;
  GqaAgg gqa = GqaAgg::Mean;
};

// Per KV head: attention summed over the last `window` queries, pooled per query head, then
// aggregated over the GQA group (kvpress order); the window itself is protected.
std::vector<HeadScores> snapkv_scores(const LayerSignals& s, const SnapKvOptions& o);

// Parameters common to the SnapKV family, with the SnapKV repository defaults.
std::vector<ParamSpec> snapkv_param_specs();
SnapKvOptions snapkv_options(const Params& p);

}  // namespace kvsim
