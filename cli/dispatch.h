#pragma once
// Subcommand dispatch shared by `kvsim` and its command groups (`kvsim trace ...`).
#include <span>
#include <string>

#include "cli/commands.h"

namespace kvsim::cli {

struct Subcommand {
  const char* name;
  const char* summary;
  int (*run)(const Args&);
};

// Runs the subcommand named by args[0] with the remaining arguments. No name or --help prints
// the list. Exit codes: kvsim::Error -> 1 with "PROG NAME: error: message" (the message names
// file, field and expectation); a command-line parsing error -> 2; an unknown name -> 2.
int dispatch(const std::string& prog, std::span<const Subcommand> subs, const Args& args);

}  // namespace kvsim::cli
