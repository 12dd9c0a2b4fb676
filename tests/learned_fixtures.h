#pragma once
// Learned policies in the tests that run every registered policy: a seeded, untrained network
// written as a model file for the geometry at hand, named in the policy's spec.
#include <filesystem>
#include <string>

#include "learned/features.h"
#include "learned/model_file.h"
#include "policies/registry.h"
#include "trace_fixtures.h"

namespace kvsim::test {

inline std::string seeded_model_file(const std::string& method, const ModelGeometry& g) {
  const std::string path =
      scratch_file("seeded_" + method + "_" + std::to_string(g.n_layers) + "_" + std::to_string(g.n_q_heads) + "_" +
                   std::to_string(g.n_kv_heads) + "_" + std::to_string(g.head_dim) + ".h5");
  if (std::filesystem::exists(path)) return path;
  learned::LearnedModel m;
  m.method = method;
  m.feature_set = learned::kFeatureSet;
  m.feature_version = learned::kFeatureVersion;
  m.features = learned::feature_names();
  m.geometry = g;
  if (method == "rlkv") {  // per-head gates only: a fixed pattern with every layer's heads ranked differently
    for (int l = 0; l < g.n_layers; ++l)
      for (int h = 0; h < g.n_kv_heads; ++h) m.head_gates.push_back(((l * 7 + h * 3) % 10) / 10.0);
  } else {
    m.network = learned::Mlp({learned::kFeatureCount, 8, 1}, learned::Activation::Tanh, 11);
    m.norm_mean.assign(learned::kFeatureCount, 0.0);
    m.norm_std.assign(learned::kFeatureCount, 1.0);
  }
  m.curve.metric = "none";
  m.provenance.created = "seeded by the tests";
  learned::write_learned_model(m, path);
  return path;
}

// True for policies that cannot run without a model file (a `model` parameter with no default).
inline bool needs_model_file(const PolicyInfo& p) {
  for (const ParamSpec& s : p.params)
    if (s.key == "model" && s.default_value.empty()) return true;
  return false;
}

// The policy's name, with a seeded model file for geometry g when it needs one.
inline std::string runnable_spec(const std::string& name, const ModelGeometry& g) {
  return needs_model_file(PolicyRegistry::instance().find(name)) ? name + ":model=" + seeded_model_file(name, g) : name;
}

// A label with the scratch directory (it changes per run) written as $SCRATCH, for golden files.
inline std::string stable_label(std::string label) {
  const std::string dir = scratch_dir().string();
  for (auto at = label.find(dir); at != std::string::npos; at = label.find(dir))
    label.replace(at, dir.size(), "$SCRATCH");
  return label;
}

}  // namespace kvsim::test
