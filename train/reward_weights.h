#pragma once
// The per-layer weights a trainer's offline reward puts on each layer's squared attention-output
// error: a `kvsim calibrate` estimator's (est_kl's), or the plain mean over layers without one.
#include <string>
#include <vector>

#include "kvcache/config.h"

namespace kvsim::train {

// Throws naming `who` and the file when the estimator was calibrated in another mode or for
// another number of layers.
std::vector<double> reward_layer_weights(const std::string& who, const std::string& estimator, int layers,
                                         ReplayMode mode);

}  // namespace kvsim::train
