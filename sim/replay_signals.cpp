#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "sim/replay_internal.h"

namespace kvsim::replay_detail {

void causal_softmax(Mat& s, const std::vector<std::int64_t>& limit) {
  for (Eigen::Index i = 0; i < s.rows(); ++i) {
    const Eigen::Index last = std::min<Eigen::Index>(limit[static_cast<std::size_t>(i)], s.cols() - 1);
    auto row = s.row(i);
    const float m = row.head(last + 1).maxCoeff();
    row.head(last + 1) = (row.head(last + 1).array() - m).exp();
    row.head(last + 1) /= row.head(last + 1).sum();
    if (last + 1 < s.cols()) row.tail(s.cols() - last - 1).setZero();
  }
}

}  // namespace kvsim::replay_detail
