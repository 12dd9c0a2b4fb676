#pragma once
// A decode-time policy step on the device (core/decode_rule.h): scores from the last-row
// weights the decode left on the device, the rule's evictions, and the cache compacted in
// place, so neither the weights nor the cache rows go to the host; only the evicted rows do (a
// few integers per entry). The CPU reference is decode_rule_step_ref, held to exactly: the
// scores are double and combined in the reference's order. (The weights are softmax outputs,
// never NaN; with NaN the block's argmin order and the reference's would differ.) Scores are
// held in double, 8 bytes a row, where the policies' byte budgets count the fp32 the papers keep:
// double makes the device's evictions the host's exactly.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/decode_rule.h"
#include "gpu/transformer_kernels.cuh"

namespace kvsim::gpu {

struct RuleStepArgs {
  DecodeRule rule;
  // Last-row weights [n_heads, stride]: head h over entry h / heads_per_entry's rows.
  const float* weights = nullptr;
  std::int64_t stride = 0;
  int n_heads = 0, heads_per_entry = 1;
  EntryRows rows;  // each entry's rows, the new one included
  // The rule's scores [scored entries, score_stride] (one for a layer-wide rule), aligned with the
  // rows before this step: updated and compacted. A rule that does not accumulate uses them as
  // its working buffer.
  double* scores = nullptr;
  std::int64_t score_stride = 0;
  // Working buffers [scored entries, work_stride]: a flag per row, and the kept rows (increasing),
  // which compact_kept_rows reads.
  std::uint8_t* gone = nullptr;
  std::int32_t* kept = nullptr;
  std::int64_t work_stride = 0;
  // [entries, report_stride]: the evicted count, then the evicted rows, increasing
  // (report_stride >= 1 + rows - budget).
  std::int32_t* report = nullptr;
  int report_stride = 0;
  std::int64_t budget = 0;
};
cudaError_t decode_rule_step(const RuleStepArgs& a, cudaStream_t stream);

// Moves each entry's kept rows (a.kept, a.report's counts) to the front of its fp16 rows, in order,
// in place: cache [entries, capacity, head_dim] halves, keys and values.
cudaError_t compact_kept_rows(const RuleStepArgs& a, std::uint16_t* cache_k, std::uint16_t* cache_v,
                              std::int64_t capacity, int head_dim, cudaStream_t stream);

}  // namespace kvsim::gpu
