#pragma once
// Learned-policy model files (HDF5; layout in docs/learned.md): the network and its input
// standardisation, the feature set and version it reads, the model geometry it was trained on,
// per-head gates (rlkv), the training curve and the provenance (traces with their sha256, request
// ids, seed, hyperparameters). Anything that does not match what a run hands it is refused
// naming the file and the field.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/geometry.h"
#include "learned/mlp.h"

namespace kvsim::learned {

inline constexpr int kModelFormatVersion = 1;

struct TrainingCurve {
  std::string metric;  // what `value` is ("loss", "reward", ...)
  std::vector<double> step, value;
};

struct TrainedRequest {
  int trace = 0;  // index into Provenance::traces
  std::string id;
  std::uint64_t prompt = 0;  // prompt_fingerprint of its prompt tokens
};

struct Provenance {
  std::vector<std::pair<std::string, std::string>> traces;  // (path as given, sha256)
  std::vector<TrainedRequest> requests;
  std::uint64_t seed = 0;
  std::string hyperparameters;  // JSON object
  std::string created;          // UTC, ISO 8601
};

struct LearnedModel {
  std::string method;  // foresight | sigmoid_gate | distillcache | rlkv
  std::string feature_set;
  int feature_version = 0;
  std::vector<std::string> features;
  ModelGeometry geometry;                   // name, arch, layers, heads, head size (RoPE and windows are not compared)
  Mlp network;                              // empty (no sizes) for methods without one (rlkv: per-head gates only)
  std::vector<double> norm_mean, norm_std;  // [inputs]: x' = (x - mean) / std before the network
  std::vector<double> head_gates;           // [n_layers * n_kv_heads] or empty
  TrainingCurve curve;
  Provenance provenance;
  std::string results;  // JSON object: what training measured (e.g. the soft-to-hard gap)
  bool has_network() const { return !network.sizes().empty(); }
};

// Writes to `path` through a temporary file renamed into place (an existing file is replaced:
// callers refuse that unless asked).
void write_learned_model(const LearnedModel& m, const std::string& path);
LearnedModel read_learned_model(const std::string& path);
// Throws naming `path` and the field when `m` was trained for another method, feature set or
// version, or model geometry (layers, query/KV heads, head size).
void check_learned_model(const LearnedModel& m, const std::string& path, const std::string& method,
                         const ModelGeometry& g);
// Its geometry part alone: what a policy checks per layer once the file was checked on loading.
void check_learned_geometry(const LearnedModel& m, const std::string& path, const ModelGeometry& g);
// The prompt fingerprints of its training requests.
std::vector<std::uint64_t> training_prompts(const LearnedModel& m);

}  // namespace kvsim::learned
