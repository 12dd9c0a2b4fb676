#pragma once
// The parity harness's report: every check prints one line (and is kept for --report); a value
// passes at NMSE <= its limit, a set or sequence only when identical. Failures are counted.
#include <cstdio>
#include <sstream>
#include <string>

namespace kvsim::gpu {

struct ParityReport {
  std::ostringstream text;
  int failures = 0;
  void line(const std::string& s) {
    std::printf("%s\n", s.c_str());
    std::fflush(stdout);
    text << s << "\n";
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
};

}  // namespace kvsim::gpu
