#pragma once
// A decode-time eviction rule stated as data (H2O, TOVA: DecodeState::rule()), so an engine can
// run a policy's decode step where its cache is (the GPU) and only the evicted rows come back.
// decode_rule_step_ref is the CPU reference the device step is held to. The rule's exact steps
// (scores, ties, layer-wide rules): docs/gpu.md, "Formats and rules the device shares".
#include <cstdint>
#include <vector>

namespace kvsim {

enum class HeadCombine : std::uint8_t { Sum = 0, Mean, Max };

struct DecodeRule {
  bool accumulate = true;   // scores add up over steps (H2O), or are this step's only (TOVA)
  bool layer_wide = false;  // one score over all query heads, the same rows dropped from every entry
  HeadCombine combine = HeadCombine::Sum;
  std::int64_t protect_newest = 0;  // the newest rows never evicted (a recent window)
};

// A rule with its state: scores [entry][row] aligned with the rows each entry holds when it
// starts (one vector, over entry 0's rows, for a layer-wide rule; empty vectors when the rule
// does not accumulate).
struct DecodeRuleStart {
  DecodeRule rule;
  std::vector<std::vector<double>> scores;
};

// The last-row weights a step reads: query head h's over its entry's rows at
// data[h * stride + m], m < rows of the entry it reads (entry h / heads_per_entry).
struct LastRowWeights {
  const float* data = nullptr;
  std::int64_t stride = 0;
  int n_heads = 0;
  int heads_per_entry = 1;
};

// The CPU reference of one step (the GPU kernel in gpu/policy_step.cuh is held to it exactly).
// (This header is C++17: the kernels include it.)
// `rows` [entry] is what each entry holds, the new row included; `scores` is the rule's state,
// updated (compacted past the evicted rows). Returns each entry's evicted rows, increasing.
// Throws std::invalid_argument naming what is out of step (scores vs rows, entry counts).
std::vector<std::vector<std::int64_t>> decode_rule_step_ref(const DecodeRule& rule,
                                                            std::vector<std::vector<double>>& scores,
                                                            const std::vector<std::int64_t>& rows,
                                                            const LastRowWeights& w, std::int64_t budget);

// The eviction every decode rule makes (and H2O's and TOVA's own steps): flags the `count`
// lowest-scored of scores[0, candidates), one at a time, ties to the lower index (the older row);
// fewer when the candidates run out. [scores.size()] flags.
std::vector<std::uint8_t> lowest_rows(const std::vector<double>& scores, std::int64_t candidates, std::int64_t count);

// Checks a rule's start against the rows its entries hold (throws std::invalid_argument).
void check_rule_start(const DecodeRuleStart& start, const std::vector<std::int64_t>& rows, int n_heads);

}  // namespace kvsim
