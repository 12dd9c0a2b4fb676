#include "train/reward_weights.h"

#include "core/error.h"
#include "sim/estimator.h"

namespace kvsim::train {

std::vector<double> reward_layer_weights(const std::string& who, const std::string& estimator, int layers,
                                         ReplayMode mode) {
  if (estimator.empty()) return std::vector<double>(static_cast<std::size_t>(layers), 1.0 / layers);
  const Estimator e = read_estimator(estimator);
  if (e.mode != mode_name(mode))
    throw Error(who + ": " + estimator + ": field 'mode' is " + e.mode + "; this training runs " + mode_name(mode) +
                " (calibrate an estimator in that mode)");
  if (static_cast<int>(e.weights.size()) != layers)
    throw Error(who + ": " + estimator + ": " + std::to_string(e.weights.size()) +
                " layer weights; the traces' model has " + std::to_string(layers) + " layers");
  return e.weights;
}

}  // namespace kvsim::train
