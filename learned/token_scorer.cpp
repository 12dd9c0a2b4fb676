#include "learned/token_scorer.h"

namespace kvsim::learned {

void standardize(std::vector<float>& x, std::int64_t rows, const std::vector<double>& mean,
                 const std::vector<double>& std_dev) {
  const auto cols = static_cast<std::int64_t>(mean.size());
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t c = 0; c < cols; ++c) {
      float& v = x[static_cast<std::size_t>(i * cols + c)];
      v = static_cast<float>((v - mean[static_cast<std::size_t>(c)]) / std_dev[static_cast<std::size_t>(c)]);
    }
}

TokenScorer::TokenScorer(std::string path, std::string method)
    : path_(std::move(path)), method_(std::move(method)), model_(read_learned_model(path_)) {
  // Method, network and features are checked here once; each layer then checks only the run's
  // geometry.
  check_learned_model(model_, path_, method_, model_.geometry);
}

std::vector<float> TokenScorer::score(const LayerSignals& s, int kv) const {
  check_learned_geometry(model_, path_, s.geometry());
  HeadFeatures f = extract_features(s, kv);
  standardize(f.x, f.tokens, model_.norm_mean, model_.norm_std);
  std::vector<float> y = model_.network.forward(f.x.data(), f.tokens);
  if (model_.network.outputs() == 1) return y;
  std::vector<float> first(static_cast<std::size_t>(f.tokens));
  for (std::int64_t i = 0; i < f.tokens; ++i)
    first[static_cast<std::size_t>(i)] = y[static_cast<std::size_t>(i * model_.network.outputs())];
  return first;
}

}  // namespace kvsim::learned
