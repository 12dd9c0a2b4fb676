#include "sim/estimator.h"

#include <Eigen/Dense>
#include <cmath>
#include <fstream>
#include <limits>
#include <type_traits>
#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"

namespace kvsim {

double Estimator::predict(const std::vector<double>& layer_feature, const std::string& where) const {
  if (layer_feature.size() != weights.size())
    throw Error(where + ": " + std::to_string(layer_feature.size()) + " layers of " + feature +
                ", but the estimator has " + std::to_string(weights.size()) +
                " layer weights (calibrated on another model?)");
  double s = 0;
  for (std::size_t l = 0; l < weights.size(); ++l) s += weights[l] * layer_feature[l];
  return s;
}

std::vector<double> nnls(const std::vector<double>& a, int rows, int cols, const std::vector<double>& b_in) {
  using Eigen::MatrixXd, Eigen::VectorXd;
  if (rows < 1 || cols < 1 || a.size() != static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols) ||
      b_in.size() != static_cast<std::size_t>(rows))
    throw Error("nnls: a " + std::to_string(rows) + " x " + std::to_string(cols) +
                " system needs that many matrix entries and " + std::to_string(rows) + " targets");
  const MatrixXd A =
      Eigen::Map<const Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(a.data(), rows, cols);
  const VectorXd b = Eigen::Map<const VectorXd>(b_in.data(), rows);
  const double tol = 1e-12 * std::max(1.0, A.cwiseAbs().maxCoeff()) * std::max(1.0, b.cwiseAbs().maxCoeff()) * rows;
  VectorXd x = VectorXd::Zero(cols);
  std::vector<bool> passive(static_cast<std::size_t>(cols), false);
  // Least squares over the passive set, zero elsewhere.
  auto solve_passive = [&] {
    std::vector<int> idx;
    for (int j = 0; j < cols; ++j)
      if (passive[static_cast<std::size_t>(j)]) idx.push_back(j);
    MatrixXd Ap(rows, static_cast<Eigen::Index>(idx.size()));
    for (std::size_t k = 0; k < idx.size(); ++k) Ap.col(static_cast<Eigen::Index>(k)) = A.col(idx[k]);
    const VectorXd sp = Ap.colPivHouseholderQr().solve(b);
    VectorXd s = VectorXd::Zero(cols);
    for (std::size_t k = 0; k < idx.size(); ++k) s(idx[k]) = sp(static_cast<Eigen::Index>(k));
    return s;
  };
  for (int iter = 0; iter < 3 * cols + 10; ++iter) {
    const VectorXd w = A.transpose() * (b - A * x);
    int best = -1;
    for (int j = 0; j < cols; ++j)
      if (!passive[static_cast<std::size_t>(j)] && w(j) > tol && (best < 0 || w(j) > w(best))) best = j;
    if (best < 0) break;
    passive[static_cast<std::size_t>(best)] = true;
    for (int inner = 0; inner < 3 * cols + 10; ++inner) {
      const VectorXd s = solve_passive();
      double alpha = std::numeric_limits<double>::infinity();
      for (int j = 0; j < cols; ++j)
        if (passive[static_cast<std::size_t>(j)] && s(j) <= 0) alpha = std::min(alpha, x(j) / (x(j) - s(j)));
      if (!std::isfinite(alpha)) {  // every passive coefficient positive: accept
        x = s;
        break;
      }
      // Step towards s until the first coefficient reaches zero, and release those that did.
      x += alpha * (s - x);
      for (int j = 0; j < cols; ++j)
        if (passive[static_cast<std::size_t>(j)] && x(j) <= 1e-15) {
          passive[static_cast<std::size_t>(j)] = false;
          x(j) = 0;
        }
    }
  }
  return {x.data(), x.data() + cols};
}

std::vector<double> fit_layer_weights(const std::vector<std::vector<double>>& features,
                                      const std::vector<double>& targets, double smoothness) {
  if (features.empty() || features.size() != targets.size())
    throw Error("calibrate: " + std::to_string(features.size()) + " feature rows for " +
                std::to_string(targets.size()) + " targets; need the same number, at least one");
  if (!(smoothness >= 0)) throw Error("calibrate: smoothness must be >= 0");
  const auto n = static_cast<int>(features.size());
  const auto L = static_cast<int>(features.front().size());
  if (L < 1) throw Error("calibrate: the feature rows have no layers");
  // Common units: the mean over layers of each layer's RMS feature, and the RMS target.
  double u = 0, v = 0;
  for (int l = 0; l < L; ++l) {
    double s = 0;
    for (const auto& f : features) {
      if (static_cast<int>(f.size()) != L) throw Error("calibrate: feature rows of different layer counts");
      s += f[static_cast<std::size_t>(l)] * f[static_cast<std::size_t>(l)];
    }
    u += std::sqrt(s / n) / L;
  }
  for (double y : targets) v += y * y;
  v = std::sqrt(v / n);
  if (!(u > 0))
    throw Error(
        "calibrate: every per-layer output error is zero (budgets of 1.0, or configs that keep everything); "
        "nothing to fit the layer weights to");
  if (!(v > 0)) throw Error("calibrate: every live KL is zero; nothing to fit the layer weights to");
  const int penalty = smoothness > 0 && L > 2 ? L - 2 : 0;
  const int rows = n + penalty;
  std::vector<double> A(static_cast<std::size_t>(rows) * static_cast<std::size_t>(L), 0.0),
      b(static_cast<std::size_t>(rows), 0.0);
  for (int i = 0; i < n; ++i) {
    for (int l = 0; l < L; ++l)
      A[static_cast<std::size_t>(i * L + l)] = features[static_cast<std::size_t>(i)][static_cast<std::size_t>(l)] / u;
    b[static_cast<std::size_t>(i)] = targets[static_cast<std::size_t>(i)] / v;
  }
  const double r = std::sqrt(smoothness * n);
  for (int k = 0; k < penalty; ++k) {  // second difference w[k] - 2 w[k+1] + w[k+2]
    const auto row = static_cast<std::size_t>((n + k) * L + k);
    A[row] = r;
    A[row + 1] = -2 * r;
    A[row + 2] = r;
  }
  std::vector<double> w = nnls(A, rows, L, b);
  for (double& x : w) x *= v / u;
  return w;
}

void write_estimator(const Estimator& e, const std::string& path) {
  const nlohmann::json j{
      {"kvsim_estimator", Estimator::kVersion},
      {"feature", e.feature},
      {"target", e.target},
      {"weights", e.weights},
      {"smoothness", e.smoothness},
      {"mode", e.mode},
      {"calibration",
       {{"requests", e.requests}, {"configs", e.configs}, {"rows", e.rows}, {"fit_spearman", e.fit_spearman}}}};
  write_file_atomically(path, j.dump(2) + "\n");
}

Estimator read_estimator(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot open the estimator file");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& ex) {
    throw FormatError(path + ": not valid JSON (" + ex.what() + "); expected a `kvsim calibrate` estimator");
  }
  auto field = [&](const char* name) -> const nlohmann::json& {
    if (!j.is_object() || !j.contains(name))
      throw FormatError(path + ": no field '" + name + "' (expected a `kvsim calibrate` estimator)");
    return j[name];
  };
  const auto& version = field("kvsim_estimator");
  if (!version.is_number_integer() || version.get<int>() != Estimator::kVersion)
    throw FormatError(path + ": field 'kvsim_estimator' is " + version.dump() + ", expected " +
                      std::to_string(Estimator::kVersion));
  // Each field read on its own, so a wrong type names the field and what it should hold.
  auto read = [&](const nlohmann::json& parent, const char* name, const char* expected, auto& out) {
    if (!parent.is_object() || !parent.contains(name))
      throw FormatError(path + ": no field '" + name + "' (expected a `kvsim calibrate` estimator)");
    try {
      out = parent[name].get<std::decay_t<decltype(out)>>();
    } catch (const nlohmann::json::exception&) {
      throw FormatError(path + ": field '" + name + "' is " + parent[name].dump() + ", expected " + expected);
    }
  };
  Estimator e;
  read(j, "feature", "a string", e.feature);
  read(j, "target", "a string", e.target);
  read(j, "weights", "an array of numbers, one per layer", e.weights);
  read(j, "smoothness", "a number", e.smoothness);
  read(j, "mode", "a string", e.mode);
  const auto& c = field("calibration");
  read(c, "requests", "an array of request ids", e.requests);
  // Counts as integers in int's range: nlohmann converts a number like 6.7e20 to int unchecked.
  auto count = [&](const char* name, int& out) {
    const auto it = c.find(name);
    if (it == c.end() || !it->is_number_integer() || *it < 0 || *it > std::numeric_limits<int>::max())
      throw FormatError(path + ": field '" + name + "' is " + (it == c.end() ? std::string("missing") : it->dump()) +
                        ", expected an integer in [0, " + std::to_string(std::numeric_limits<int>::max()) + "]");
    out = it->get<int>();
  };
  count("configs", e.configs);
  count("rows", e.rows);
  e.fit_spearman =
      c.contains("fit_spearman") && c["fit_spearman"].is_number() ? c["fit_spearman"].get<double>() : std::nan("");
  if (e.feature != "layer_out_sq")
    throw FormatError(path + ": field 'feature' is '" + e.feature + "', expected 'layer_out_sq'");
  if (e.weights.empty()) throw FormatError(path + ": field 'weights' is empty, expected one weight per layer");
  for (double w : e.weights)
    if (!(w >= 0) || !std::isfinite(w))
      throw FormatError(path + ": field 'weights' holds " + std::to_string(w) + ", expected finite values >= 0");
  return e;
}

}  // namespace kvsim
