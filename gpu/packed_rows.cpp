#include "gpu/packed_rows.h"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

namespace kvsim::gpu {

CompactRows compact_rows(const PackedTensor& t) {
  CompactRows out;
  out.rows.reserve(t.rows.size());
  const bool positions =
      t.rotate && std::any_of(t.rows.begin(), t.rows.end(), [](const PackedRow& r) { return r.kind == PackedKind::LowRank; });
  constexpr std::int64_t kMax = std::numeric_limits<std::uint32_t>::max();
  for (std::size_t m = 0; m < t.rows.size(); ++m) {
    const PackedRow& r = t.rows[m];
    if (r.data < 0 || r.data > kMax || r.param < 0 || r.param > kMax)
      throw std::invalid_argument("packed row " + std::to_string(m) + ": offsets " + std::to_string(r.data) + " / " +
                                  std::to_string(r.param) + " do not fit the device's 32-bit row table");
    out.rows.push_back({static_cast<std::uint32_t>(r.data), static_cast<std::uint32_t>(r.param), r.rank,
                        static_cast<std::uint8_t>(r.kind), 0});
    if (positions) out.positions.push_back(r.position);
  }
  return out;
}

}  // namespace kvsim::gpu
