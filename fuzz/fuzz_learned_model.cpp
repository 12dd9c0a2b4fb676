// Fuzz target: learned-policy model files (HDF5, learned/model_file.h), then what a sweep does
// with one: checked against the run's method and geometry, and the policy run over the small
// synthetic trace. Seeds: a seeded model file of each learned method for that trace's geometry,
// written by the tests' fixture writer. The HDF5 library's own crashes on corrupt metadata end in
// the forked child that read_learned_model reads the file in first (traces/trace_probe.h).
#include <cstdint>
#include <filesystem>
#include <sstream>

#include "core/error.h"
#include "fuzz/fuzz_input.h"
#include "fuzz/seed_writer.h"
#include "fuzz/small_trace.h"
#include "learned/model_file.h"
#include "fuzz/quiet_sweep.h"
#include "sim/sweep.h"
#include "tests/learned_fixtures.h"
#include "traces/trace_reader.h"

namespace {

const char* const kMethods[] = {"foresight", "sigmoid_gate", "distillcache", "rlkv"};

const kvsim::ModelGeometry& small_geometry() {
  static const kvsim::ModelGeometry g = kvsim::TraceReader(kvsim::fuzz::small_trace()).geometry();
  return g;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  return kvsim::fuzz::seeds_then_exit([](const std::string& dir) {
    for (const char* method : kMethods)
      std::filesystem::copy_file(kvsim::test::seeded_model_file(method, small_geometry()), dir + "/" + method + ".h5",
                                 std::filesystem::copy_options::overwrite_existing);
  });
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = kvsim::fuzz::input_file(data, size, "learned.h5");
  try {
    const kvsim::learned::LearnedModel m = kvsim::learned::read_learned_model(path);
    kvsim::learned::check_learned_model(m, path, m.method, small_geometry());
    kvsim::fuzz::run_quiet(kvsim::fuzz::quiet_sweep({kvsim::fuzz::small_trace()}, {m.method + ":model=" + path}, {0.5},
                                                    "learned_sweep.csv"));
  } catch (const kvsim::Error&) {
  }
  return 0;
}
