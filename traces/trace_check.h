#pragma once
// Full validation of a kvtrace file (`kvsim trace check`): everything the reader checks on
// open, plus every request's header, every layer's K/V/Q (each chunk's checksum, and NaN/Inf),
// the reference rows and the reconstruction pass. Collects all problems instead of stopping at
// the first, each naming request, dataset and layer.
#include <cstdint>
#include <string>
#include <vector>

namespace kvsim {

struct TraceCheckReport {
  std::vector<std::string> errors;
  std::vector<std::string> notes;  // not errors: e.g. requests written before checksums
  std::int64_t requests_checked = 0;
  std::int64_t tokens_checked = 0;
  bool ok() const { return errors.empty(); }
};

TraceCheckReport check_trace(const std::string& path);

// check_trace in a child process: a file corrupt enough to crash the HDF5 library yields an
// error line saying so, and the caller survives. What `kvsim trace check` runs.
TraceCheckReport check_trace_isolated(const std::string& path);

// The error line for a file whose parsing killed a child process with `signal`.
std::string crashed_parser_message(const std::string& path, int signal);

// Index of the first non-finite half (exponent all ones) in `bits`, or -1.
std::int64_t first_nonfinite_half(const std::uint16_t* bits, std::size_t n, std::size_t* count);

}  // namespace kvsim
