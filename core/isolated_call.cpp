#include "core/isolated_call.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <exception>

#include "core/error.h"

// A sanitizer runtime's hook, run before it ends a process on a finding; absent without one.
extern "C" void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));

namespace kvsim {

namespace {

// The child dies of what it meets, whatever the parent installed: a fuzzer's signal handlers and
// sanitizer death callback would otherwise treat the child's crash as the parent's own finding.
void die_plainly() {
  for (const int sig : {SIGSEGV, SIGBUS, SIGABRT, SIGILL, SIGFPE}) ::signal(sig, SIG_DFL);
  if (__sanitizer_set_death_callback) __sanitizer_set_death_callback(nullptr);
}

void write_all(int fd, const std::string& s) {
  std::size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    off += static_cast<std::size_t>(n);
  }
}

}  // namespace

IsolatedResult run_isolated(const std::function<std::string()>& fn) {
  int fds[2];
  if (::pipe(fds) != 0) throw Error("run_isolated: pipe() failed");
  const pid_t pid = ::fork();
  if (pid < 0) throw Error("run_isolated: fork() failed");
  if (pid == 0) {
    ::close(fds[0]);
    die_plainly();
    std::string msg;
    try {
      msg = "O" + fn();
    } catch (const std::exception& e) {
      msg = std::string("E") + e.what();
    } catch (...) {
      msg = "Eunknown exception";
    }
    write_all(fds[1], msg);
    ::close(fds[1]);
    ::_exit(0);  // no atexit handlers or static destructors: they belong to the parent
  }
  ::close(fds[1]);
  std::string data;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    data.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  IsolatedResult r;
  if (WIFSIGNALED(status) || data.empty()) {
    r.status = IsolatedResult::Status::Crashed;
    r.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    return r;
  }
  r.status = data[0] == 'O' ? IsolatedResult::Status::Ok : IsolatedResult::Status::Threw;
  r.output = data.substr(1);
  return r;
}

}  // namespace kvsim
