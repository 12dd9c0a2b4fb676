#pragma once
// Helpers shared by the benchmarks: wall-clock timing, a reference GEMM rate measured in the same
// run, and peak RSS measured in a fresh child process (so the parent's memory does not count).
#include <sys/wait.h>
#include <unistd.h>

#include <Eigen/Dense>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace kvsim::bench {

using Clock = std::chrono::steady_clock;

inline double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Best of 5 single-precision 1024^3 GEMMs, GFLOP/s.
inline double eigen_gemm_gflops() {
  const int n = 1024;
  const Eigen::MatrixXf a = Eigen::MatrixXf::Random(n, n), b = Eigen::MatrixXf::Random(n, n);
  Eigen::MatrixXf c(n, n);
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    c.noalias() = a * b;
    best = std::min(best, since(t0));
  }
  return 2.0 * n * n * n / best / 1e9 + 0 * c(0, 0);
}

// The calling process's peak RSS in bytes, printed on stdout: what a child run ends with. VmHWM
// belongs to the address space exec created; getrusage's ru_maxrss would also count the
// parent's RSS at fork time, which Linux carries across exec.
inline void print_own_peak_rss() {
  long kb = -1;
  if (FILE* f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    while (std::fgets(line, sizeof line, f))
      if (std::sscanf(line, "VmHWM: %ld kB", &kb) == 1) break;
    std::fclose(f);
  }
  std::printf("%ld\n", kb * 1024L);
}

// Re-runs this benchmark binary with `args` (its child mode must end with print_own_peak_rss)
// and returns the child's peak RSS in bytes, or -1 if the measurement failed.
inline long child_peak_rss(const std::vector<std::string>& args) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    std::vector<char*> argv{const_cast<char*>("bench")};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv("/proc/self/exe", argv.data());
    _exit(127);
  }
  close(fds[1]);
  char buf[64] = {};
  const ssize_t n = read(fds[0], buf, sizeof buf - 1);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return n > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? std::atol(buf) : -1;
}

}  // namespace kvsim::bench
