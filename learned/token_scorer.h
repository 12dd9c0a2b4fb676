#pragma once
// A learned model file applied to a layer's signals: features (features.h), standardised as the
// model was trained, through its network. Shared by the learned policies.
#include <string>
#include <vector>

#include "learned/features.h"
#include "learned/model_file.h"

namespace kvsim::learned {

// Standardises rows in place with the model's mean and std: x' = (x - mean) / std.
void standardize(std::vector<float>& x, std::int64_t rows, const std::vector<double>& mean,
                 const std::vector<double>& std_dev);

class TokenScorer {
 public:
  // Reads `path`; throws naming it when it is not a model of `method`.
  TokenScorer(std::string path, std::string method);
  const LearnedModel& model() const { return model_; }
  const std::string& path() const { return path_; }
  // The network's first output for every cached token of KV head kv. Throws naming the file when
  // it was trained for another model geometry.
  std::vector<float> score(const LayerSignals& s, int kv) const;

 private:
  std::string path_, method_;
  LearnedModel model_;
};

}  // namespace kvsim::learned
