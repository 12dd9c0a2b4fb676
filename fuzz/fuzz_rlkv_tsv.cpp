// Fuzz target: RLKV's released gate files (adapter_weights.tsv, train/rlkv_trainer.h), imported as
// `kvsim train rlkv --import` does for the small synthetic trace's geometry, written as a model
// file, then the rlkv policy run on it over that trace. Seeds: gate tables of that geometry (two
// layers, one KV head) in RLKV's format, and one of another geometry.
#include <cstdint>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "fuzz/fuzz_input.h"
#include "fuzz/seed_writer.h"
#include "fuzz/small_trace.h"
#include "learned/model_file.h"
#include "fuzz/quiet_sweep.h"
#include "sim/sweep.h"
#include "traces/trace_reader.h"
#include "train/rlkv_trainer.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  return kvsim::fuzz::seeds_then_exit([](const std::string& dir) {
    std::ofstream(dir + "/gates.tsv") << "0.91\n0.07\n";
    std::ofstream(dir + "/crlf.tsv") << "1\r\n\r\n0.5\r\n";
    std::ofstream(dir + "/wide.tsv") << "0.1\t0.9\t0.3\n0.2\t0.8\t0.4\n";
  });
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = kvsim::fuzz::input_file(data, size, "adapter_weights.tsv");
  const std::string& trace = kvsim::fuzz::small_trace();
  try {
    const kvsim::learned::LearnedModel m =
        kvsim::train::import_rlkv_tsv(path, kvsim::TraceReader(trace).geometry(), trace);
    const std::string model = kvsim::fuzz::output_file("rlkv_model.h5");
    kvsim::learned::write_learned_model(m, model);
    kvsim::fuzz::run_quiet(kvsim::fuzz::quiet_sweep({trace}, {"rlkv:model=" + model}, {0.3}, "rlkv_sweep.csv"));
  } catch (const kvsim::Error&) {
  }
  return 0;
}
