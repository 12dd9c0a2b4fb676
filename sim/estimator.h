#pragma once
// The offline estimate of live KL (issue 24; docs/estimator.md): a weighted sum over layers of
// each layer's mean squared attention-output error, est = sum_l w_l * E|o_l - o'_l|^2, with
// non-negative weights fitted by `kvsim calibrate` to live runs of a calibration split and
// smoothed across depth. Replay measures each layer's error with the full cache upstream; the
// weights stand for how much an error at that depth grows by the output.
#include <string>
#include <vector>

namespace kvsim {

struct Estimator {
  static constexpr int kVersion = 1;
  std::string feature = "layer_out_sq";  // the detail field the weights apply to
  std::string target = "live_kl";        // what they were fitted to predict
  std::vector<double> weights;           // per layer, >= 0
  double smoothness = 0;                 // the depth-smoothness strength of the fit
  // Where it came from: the mode and model geometry of the sweep, and the live runs it was fitted on.
  std::string mode;
  std::vector<std::string> requests;  // calibration requests: agreement leaves them out
  int configs = 0, rows = 0;
  double fit_spearman = 0;  // over the calibration configs (in-sample)

  // est_kl of one (request, config) from its per-layer feature; throws naming `where` when the
  // layer count differs from the weights'.
  double predict(const std::vector<double>& layer_feature, const std::string& where) const;
};

// Non-negative least squares, min |A x - b| subject to x >= 0 (Lawson and Hanson's active set).
// A is rows x cols, row-major.
std::vector<double> nnls(const std::vector<double>& A, int rows, int cols, const std::vector<double>& b);

// Fits weights to (features [n][L], targets [n]) by NNLS with a penalty smoothness * n * |D w|^2
// on the second differences of the weights across depth (features scaled to a common unit
// first, so the strength does not depend on their magnitude).
std::vector<double> fit_layer_weights(const std::vector<std::vector<double>>& features,
                                      const std::vector<double>& targets, double smoothness);

void write_estimator(const Estimator& e, const std::string& path);
// Errors name the file and the field that is missing or malformed.
Estimator read_estimator(const std::string& path);

}  // namespace kvsim
