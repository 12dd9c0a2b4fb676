#pragma once
// Hostile traces never take a command down. HDF5 1.10 has out-of-bounds reads and crashes of its
// own on corrupt object headers and chunk indexes (docs/fuzzing.md), which no check of ours can
// catch in-process. So before a process touches a trace, a forked child opens it and walks every
// object any read may touch (TraceReader::walk_request over every committed request); what the
// child survived, the same reads in the parent survive, since they read the same bytes the same
// way. A checksummed layer's data is read past HDF5's pipeline by our own code, so the child
// touches its chunk index only and the walk costs metadata, not a second read of the data.
#include <string>

namespace kvsim {

// The error for a file that crashed the HDF5 library (or a child that died with no answer).
std::string crashed_parser_message(const std::string& path, int signal);

// Walks `path` in a forked child; throws FormatError(crashed_parser_message) when the child died.
// Errors the walk meets are the reads' own and are left to them.
void probe_trace(const std::string& path);

}  // namespace kvsim
