// Fuzz target: estimator files (JSON, sim/estimator.h, written by `kvsim calibrate`), then what
// `kvsim sweep --estimator` does with one: est_kl predicted from per-layer errors, for the right
// layer count and a wrong one. Seeds: estimators written by write_estimator.
#include <cstdint>

#include "core/error.h"
#include "fuzz/fuzz_input.h"
#include "fuzz/seed_writer.h"
#include "sim/estimator.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  return kvsim::fuzz::seeds_then_exit([](const std::string& dir) {
    kvsim::Estimator e;
    e.weights = {0.5, 0.25, 0.0, 1.5};
    e.smoothness = 0.1;
    e.mode = "query-aware";
    e.requests = {"r0", "r1"};
    e.configs = 12;
    e.rows = 24;
    e.fit_spearman = 0.9;
    kvsim::write_estimator(e, dir + "/four_layers.json");
    e.weights = {2.0};
    e.requests.clear();
    e.mode = "query-agnostic";
    kvsim::write_estimator(e, dir + "/one_layer.json");
  });
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = kvsim::fuzz::input_file(data, size, "estimator.json");
  try {
    const kvsim::Estimator e = kvsim::read_estimator(path);
    for (const std::size_t layers : {e.weights.size(), std::size_t{3}}) {
      try {
        (void)e.predict(std::vector<double>(layers, 0.01), path);
      } catch (const kvsim::Error&) {
      }
    }
  } catch (const kvsim::Error&) {
  }
  return 0;
}
