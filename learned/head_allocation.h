#pragma once
// RLKV / DuoAttention at a byte budget: the model's KV heads either keep their whole cache
// ("retrieval" heads) or only sinks + recent tokens ("streaming" heads). The budget decides how
// many heads, in gate order over the whole model, keep everything; what is left widens the
// streaming heads' recent windows evenly, so the model holds its budget (docs/learned.md).
#include <cstdint>
#include <span>
#include <vector>

namespace kvsim::learned {

struct HeadAllocation {
  std::vector<std::int64_t> keep;  // tokens each head keeps
  std::vector<std::uint8_t> full;  // 1: the head keeps its whole cache
};

// gates[h], cache sizes n[h]; `total` tokens for the layer; streaming heads keep `sinks` + at least
// `recent` recent tokens when the budget allows (else budget / heads each). Ties in gate: the
// lower head index first.
HeadAllocation allocate_heads(const std::vector<double>& gates, const std::vector<std::int64_t>& n, std::int64_t total,
                              std::int64_t sinks, std::int64_t recent);

// The keep mask of a head holding `keep` of its cached tokens (token indices, ascending) as a
// streaming head does: the sinks (tokens below `sinks`) first, then the most recent.
std::vector<std::uint8_t> streaming_mask(std::span<const std::int32_t> cached, std::int64_t sinks, std::int64_t keep);

}  // namespace kvsim::learned
