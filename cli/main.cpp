// kvsim: one CLI, one subcommand per job (trace now; capture, sweep, verify, serve, report later).
#include <iostream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"

namespace {

struct Command {
  const char* name;
  const char* summary;
  int (*run)(const kvsim::cli::Args&);
};

const Command kCommands[] = {
    {"trace", "inspect, validate and synthesize kvtrace HDF5 files", kvsim::cli::trace_command},
};

void usage(std::ostream& os) {
  os << "usage: kvsim <command> [options]   (kvsim <command> --help for details)\n\ncommands:\n";
  for (const auto& c : kCommands) os << "  " << c.name << "    " << c.summary << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    usage(args.empty() ? std::cerr : std::cout);
    return args.empty() ? 2 : 0;
  }
  if (args[0] == "--version") {
    std::cout << "kvsim " << KVSIM_VERSION << "\n";
    return 0;
  }
  for (const auto& c : kCommands) {
    if (args[0] != c.name) continue;
    try {
      return c.run({args.begin() + 1, args.end()});
    } catch (const kvsim::Error& e) {
      std::cerr << "kvsim " << c.name << ": error: " << e.what() << "\n";
      return 1;
    } catch (const std::exception& e) {
      std::cerr << "kvsim " << c.name << ": internal error: " << e.what() << "\n";
      return 1;
    }
  }
  std::cerr << "kvsim: unknown command '" << args[0] << "'\n";
  usage(std::cerr);
  return 2;
}
