#include "core/isolated_call.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <exception>

#include "core/error.h"

namespace kvsim {

namespace {

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
