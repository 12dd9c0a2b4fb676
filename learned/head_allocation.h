#pragma once
// RLKV / DuoAttention at a byte budget: a layer's KV heads either keep their whole cache
// ("retrieval" heads) or only sinks + recent tokens ("streaming" heads). The budget decides how
// many heads, in gate order, keep everything; what is left widens the streaming heads' recent
// windows evenly, so the layer holds its budget (docs/learned.md).
#include <cstdint>
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

}  // namespace kvsim::learned
