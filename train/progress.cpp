#include "train/progress.h"

#include <cstdio>

namespace kvsim::train {

double Progress::elapsed() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
}

void Progress::update(std::int64_t step, const std::string& metric, double value) {
  const std::int64_t every = std::max<std::int64_t>(1, steps_ / 10);
  const bool last = step == steps_;
  if (!tty_ && !last && step / every == last_printed_ / every) return;
  last_printed_ = step;
  const double spent = elapsed();
  const double left = step > 0 ? spent * static_cast<double>(steps_ - step) / static_cast<double>(step) : 0.0;
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s: step %lld/%lld  %s %.5g  %.1f s spent, ~%.1f s left", what_.c_str(),
                static_cast<long long>(step), static_cast<long long>(steps_), metric.c_str(), value, spent, left);
  os_ << (tty_ ? "\r" : "") << buf << (tty_ && !last ? "   " : "\n") << std::flush;
}

}  // namespace kvsim::train
