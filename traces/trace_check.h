#pragma once
// Full validation of a kvtrace file (`kvsim trace check`): everything the reader checks on
// open, plus every request's header, every layer's K/V/Q (each chunk's checksum, and NaN/Inf),
// the reference rows and the reconstruction pass. Collects all problems instead of stopping at
// the first, each naming request, dataset and layer.
#include <cstdint>
#include <string>
#include <vector>

#include "traces/trace_reader.h"

namespace kvsim {

struct TraceCheckReport {
  std::vector<std::string> errors;
  std::vector<std::string> notes;  // not errors: e.g. requests written before checksums
  std::int64_t requests_checked = 0;
  std::int64_t tokens_checked = 0;
  bool ok() const { return errors.empty(); }
};

// `how`: Probed (the default) walks the file in a child first (traces/trace_probe.h), so a file
// that crashes the HDF5 library is one error line; Trusted where the caller is that child.
TraceCheckReport check_trace(const std::string& path, TraceOpen how = TraceOpen::Probed);

// check_trace in a child process, all of it: a file corrupt enough to crash the HDF5 library
// yields an error line saying so, and the caller survives. What `kvsim trace check` runs.
TraceCheckReport check_trace_isolated(const std::string& path);

// Index of the first non-finite half (exponent all ones) in `bits`, or -1.
std::int64_t first_nonfinite_half(const std::uint16_t* bits, std::size_t n, std::size_t* count);

}  // namespace kvsim
