#include "traces/trace_probe.h"

#include <cstring>

#include "core/error.h"
#include "core/isolated_call.h"
#include "traces/trace_reader.h"

namespace kvsim {

std::string crashed_parser_message(const std::string& path, int signal, const std::string& expected) {
  return path + ": reading this file crashed the HDF5 library (" +
         (signal ? std::string(strsignal(signal)) : std::string("no result")) +
         "): its HDF5 metadata is corrupt; expected " + expected;
}

void probe_hdf5(const std::string& path, const std::function<void()>& walk, const std::string& expected) {
  const IsolatedResult r = run_isolated([&] {
    walk();
    return std::string();
  });
  if (r.status == IsolatedResult::Status::Crashed) throw FormatError(crashed_parser_message(path, r.signal, expected));
}

void probe_trace(const std::string& path) {
  probe_hdf5(
      path,
      [&] {
        const TraceReader reader(path, TraceOpen::Trusted);
        for (const std::string& id : reader.request_ids()) reader.walk_request(id);
      },
      "a valid kvtrace HDF5 file");
}

}  // namespace kvsim
