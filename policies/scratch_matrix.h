#pragma once
// A per-thread work matrix that only grows (include only where Eigen is already in use). Replay
// runs the same shapes for every config, head and layer: fresh megabyte buffers would be mapped
// and faulted in again each time.
#include <Eigen/Core>
#include <vector>

namespace kvsim {

class ScratchMatrix {
 public:
  using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  // A rows x cols view of the buffer; its values are whatever the last user left.
  Eigen::Map<Mat> get(Eigen::Index rows, Eigen::Index cols) {
    if (static_cast<Eigen::Index>(data_.size()) < rows * cols) data_.resize(static_cast<std::size_t>(rows * cols));
    return {data_.data(), rows, cols};
  }

 private:
  std::vector<float, Eigen::aligned_allocator<float>> data_;
};

}  // namespace kvsim
