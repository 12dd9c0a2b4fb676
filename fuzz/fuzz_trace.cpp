// Fuzz target: kvtrace files (traces/*): `trace check` in-process, then a sweep of three policies
// over the same file, as a user who skipped the check would run it. Seeds: synthetic traces from
// the writer every capture uses (make_corpus.sh).
//
// Both open the file as every command does: probed first, in a forked child that walks every
// object a read may touch (traces/trace_probe.h), so HDF5 1.10's own crashes on corrupt metadata
// end in that child and come back as a named error. A crash here, in this process, is a hole in
// the probe: a read that the walk does not make. fuzz_trace_hdf5 fuzzes the unprotected reads.
#include <hdf5.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "core/error.h"
#include "fuzz/fuzz_input.h"
#include "fuzz/quiet_sweep.h"
#include "sim/sweep.h"
#include "traces/trace_check.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = kvsim::fuzz::input_file(data, size, "trace.h5");
  try {
    (void)kvsim::check_trace(path);
  } catch (const kvsim::Error&) {
  }
  try {
    kvsim::fuzz::run_quiet(
        kvsim::fuzz::quiet_sweep({path}, {"snapkv:window=4", "h2o", "kivi"}, {0.5}, "trace_sweep.csv"));
  } catch (const kvsim::Error&) {
  }
  // Every file, dataset, attribute and type kvsim opened is closed again, on every error path
  // (fuzz/lsan.supp leaves HDF5's own allocations out of the leak check).
  if (const ssize_t open = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL); open != 0) {
    std::fprintf(stderr, "fuzz_trace: %zd HDF5 identifiers left open after this input\n", open);
    std::abort();
  }
  return 0;
}
