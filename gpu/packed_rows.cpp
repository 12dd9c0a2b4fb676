#include "gpu/packed_rows.h"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

namespace kvsim::gpu {

RowTable row_table(const PackedTensor& t, int head_dim) {
  RowTable out;
  const bool positions = t.rotate && std::any_of(t.rows.begin(), t.rows.end(),
                                                 [](const PackedRow& r) { return r.kind == PackedKind::LowRank; });
  constexpr std::int64_t kMax = std::numeric_limits<std::uint32_t>::max();
  // Runs are counted in an int on the device (a run a row at most).
  if (t.rows.size() > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()))
    throw std::invalid_argument("packed tensor of " + std::to_string(t.rows.size()) +
                                " rows: more than the device's row index holds");
  const std::int64_t groups = t.param_span > 0 ? head_dim / t.param_span : 0;
  std::int64_t len = 0;  // rows in the last run
  int step = -1;         // the last run's pairs: -1 not yet known (one row), 0 shared, 1 each row its own
  for (std::size_t m = 0; m < t.rows.size(); ++m) {
    const PackedRow& r = t.rows[m];
    if (r.data < 0 || r.data > kMax || r.param < 0 || r.param > kMax)
      throw std::invalid_argument("packed row " + std::to_string(m) + ": offsets " + std::to_string(r.data) + " / " +
                                  std::to_string(r.param) + " do not fit the device's 32-bit row table");
    if (positions) out.positions.push_back(r.position);
    bool extends = false;
    if (!out.runs.empty()) {
      RowRun& run = out.runs.back();
      extends = static_cast<std::uint8_t>(r.kind) == run.kind && r.rank == run.rank &&
                r.data == run.data + len * packed_row_size(r.kind, r.rank, head_dim, t.bits);
      if (extends && r.kind == PackedKind::Quant) {
        const bool shared = r.param == run.param, own = r.param == run.param + len * groups;
        if (step == -1) step = shared ? 0 : (own ? 1 : -1);
        extends = (step == 0 && shared) || (step == 1 && own);
        run.own_params = step == 1;
      }
    }
    if (extends) {
      ++len;
      continue;
    }
    out.runs.push_back({static_cast<std::uint32_t>(m), static_cast<std::uint32_t>(r.data),
                        static_cast<std::uint32_t>(r.param), r.rank, static_cast<std::uint8_t>(r.kind), 0});
    len = 1;
    step = -1;
  }
  return out;
}

}  // namespace kvsim::gpu
