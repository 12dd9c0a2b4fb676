#pragma once
// The parity harness's report: every check prints one line; a value passes at NMSE <= its limit,
// a set or sequence only when identical. Failures are counted. With a report file, each line is
// written and flushed as it comes, so a run cut short by a time limit or a crash keeps what it had
// checked (device time is scarce: a first run must leave evidence even when it fails).
#include <cstdio>
#include <fstream>
#include <string>

namespace kvsim::gpu {

struct ParityReport {
  std::ofstream file;
  int failures = 0;
  // Returns false when the file cannot be written.
  bool open(const std::string& path) {
    file.open(path, std::ios::trunc);
    return static_cast<bool>(file);
  }
  void line(const std::string& s) {
    std::printf("%s\n", s.c_str());
    std::fflush(stdout);
    if (file.is_open()) file << s << "\n" << std::flush;
  }
  void value(const std::string& what, double nmse, double limit) {
    const bool ok = nmse <= limit;  // NaN fails
    failures += !ok;
    char buf[320];
    std::snprintf(buf, sizeof buf, "  %-52s NMSE %.3e (<= %.0e)  %s", what.c_str(), nmse, limit, ok ? "ok" : "FAIL");
    line(buf);
  }
  void same(const std::string& what, bool equal) {
    failures += !equal;
    line("  " + what + (equal ? "  identical  ok" : "  DIFFERENT  FAIL"));
  }
  // A section that could not finish (an exception, a CUDA error) counts as a failure.
  void fail(const std::string& what) {
    ++failures;
    line("  " + what + "  FAIL");
  }
};

}  // namespace kvsim::gpu
