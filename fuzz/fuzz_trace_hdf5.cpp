// Fuzz target: the HDF5 library itself under kvsim's trace reads, in-process and unprotected
// (TraceOpen::Trusted): every object a read may touch (TraceReader::walk_request), then a full
// check. Its crashes are HDF5 1.10's own; each one found is an input that the probed open must
// survive (traces/trace_probe.h). Reduced to one changed byte each, they are the regression corpus
// tests/python/make_hostile_traces.py writes, which `sweep` and the other trace commands must
// refuse with a named error. fuzz_trace then fuzzes the
// probed path, where any crash is a hole in the probe. scripts/fuzz.sh runs this one with -fork
// and keeps going past crashes.
#include <cstdint>

#include "core/error.h"
#include "fuzz/fuzz_input.h"
#include "traces/trace_check.h"
#include "traces/trace_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = kvsim::fuzz::input_file(data, size, "trace_hdf5.h5");
  try {
    const kvsim::TraceReader reader(path, kvsim::TraceOpen::Trusted);
    for (const std::string& id : reader.request_ids()) reader.walk_request(id);
  } catch (const kvsim::Error&) {
  }
  (void)kvsim::check_trace(path, kvsim::TraceOpen::Trusted);
  return 0;
}
