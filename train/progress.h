#pragma once
// The trainers' progress line: step, the metric, time spent and an estimate of time left. On a
// terminal one line rewritten in place, otherwise a line every tenth of the run.
#include <chrono>
#include <cstdint>
#include <ostream>
#include <string>

namespace kvsim::train {

class Progress {
 public:
  Progress(std::ostream& os, std::string what, std::int64_t steps, bool tty)
      : os_(os), what_(std::move(what)), steps_(steps), tty_(tty), t0_(std::chrono::steady_clock::now()) {}
  void update(std::int64_t step, const std::string& metric, double value);
  double elapsed() const;

 private:
  std::ostream& os_;
  std::string what_;
  std::int64_t steps_;
  bool tty_;
  std::chrono::steady_clock::time_point t0_;
  std::int64_t last_printed_ = -1;
};

}  // namespace kvsim::train
