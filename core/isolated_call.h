#pragma once
// Runs a function in a forked child and returns what it printed. Used where a third-party
// parser may crash on hostile input (HDF5 1.10 segfaults on some corrupt object headers): the
// crash then becomes an error message for the user instead of taking the process down.
#include <functional>
#include <string>

namespace kvsim {

struct IsolatedResult {
  enum class Status { Ok, Threw, Crashed } status = Status::Ok;
  std::string output;  // fn's return value (Ok) or the exception message (Threw)
  int signal = 0;      // the signal that ended the child (Crashed)
};

// `fn` runs in a child process; its return value travels back through a pipe. Exceptions in
// the child come back as Threw with their message; death by a signal as Crashed.
IsolatedResult run_isolated(const std::function<std::string()>& fn);

}  // namespace kvsim
