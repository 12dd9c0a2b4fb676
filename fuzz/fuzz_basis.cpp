// Fuzz target: calibration basis files (binary, policies/basis_set.h, written by `kvsim trace
// fit-basis`), then what a sweep does with one: checked against the trace's geometry, and the
// low-rank policies run on it over the small synthetic trace. Seeds: bases fitted on that trace.
#include <cstdint>
#include <sstream>

#include "core/error.h"
#include "fuzz/fuzz_input.h"
#include "fuzz/seed_writer.h"
#include "fuzz/small_trace.h"
#include "policies/basis_set.h"
#include "sim/calibration.h"
#include "fuzz/quiet_sweep.h"
#include "sim/sweep.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  return kvsim::fuzz::seeds_then_exit([](const std::string& dir) {
    kvsim::save_basis_set(kvsim::fit_calibration_bases({kvsim::fuzz::small_trace()}), dir + "/small.basis");
    kvsim::save_basis_set(kvsim::fit_calibration_bases({kvsim::fuzz::small_trace()}, 1), dir + "/one_request.basis");
  });
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = kvsim::fuzz::input_file(data, size, "calibration.basis");
  try {
    (void)kvsim::load_basis_set(path);
    kvsim::fuzz::run_quiet(kvsim::fuzz::quiet_sweep(
        {kvsim::fuzz::small_trace()}, {"lowrank:basis=" + path, "varrate:basis=" + path}, {0.4}, "basis_sweep.csv"));
  } catch (const kvsim::Error&) {
  }
  return 0;
}
