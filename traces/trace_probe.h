#pragma once
// Hostile traces never take a command down. HDF5 1.10 has out-of-bounds reads and crashes of its
// own on corrupt object headers and chunk indexes (docs/fuzzing.md), which no check of ours can
// catch in-process. So before a process touches a trace, a forked child opens it and walks every
// object any read may touch (TraceReader::walk_request over every committed request); what the
// child survived, the same reads in the parent survive, since they read the same bytes the same
// way. A checksummed layer's data is read past HDF5's pipeline by our own code, so the child
// touches its chunk index only and the walk costs metadata, not a second read of the data.
#include <functional>
#include <string>

namespace kvsim {

// The error for a file that crashed the HDF5 library (or a child that died with no answer);
// `expected` says what the file should have been.
std::string crashed_parser_message(const std::string& path, int signal,
                                   const std::string& expected = "a valid kvtrace HDF5 file");

// Runs `walk` over the HDF5 file `path` in a forked child; throws
// FormatError(crashed_parser_message(path, signal, expected)) when the child died. Errors the walk
// throws are left to the in-process reads, which meet them too.
void probe_hdf5(const std::string& path, const std::function<void()>& walk, const std::string& expected);

// probe_hdf5 over a trace: opened Trusted, every committed request walked.
void probe_trace(const std::string& path);

}  // namespace kvsim
