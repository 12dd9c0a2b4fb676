#include "cli/dispatch.h"

#include <algorithm>
#include <boost/program_options/errors.hpp>
#include <iomanip>
#include <string_view>
#include <iostream>

#include "core/error.h"

namespace kvsim::cli {

int dispatch(const std::string& prog, std::span<const Subcommand> subs, const Args& args) {
  auto usage = [&](std::ostream& os) {
    os << "usage: " << prog << " <command> [options]   (" << prog << " <command> --help for details)\n\ncommands:\n";
    std::size_t width = 0;
    for (const auto& s : subs) width = std::max(width, std::string_view(s.name).size());
    for (const auto& s : subs)
      os << "  " << std::left << std::setw(static_cast<int>(width + 2)) << s.name << s.summary << "\n";
  };
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    usage(args.empty() ? std::cerr : std::cout);
    return args.empty() ? 2 : 0;
  }
  for (const auto& s : subs) {
    if (args[0] != s.name) continue;
    const std::string who = prog + " " + s.name;
    try {
      // -q quiets std::cerr for the command's run only: errors below are always printed.
      struct RestoreStderr {
        std::streambuf* saved = std::cerr.rdbuf();
        ~RestoreStderr() { std::cerr.rdbuf(saved); }
      } restore;
      return s.run({args.begin() + 1, args.end()});
    } catch (const boost::program_options::error& e) {
      std::cerr << who << ": " << e.what() << " (see --help)\n";
      return 2;
    } catch (const Error& e) {
      std::cerr << who << ": error: " << e.what() << "\n";
      return 1;
    } catch (const std::exception& e) {
      std::cerr << who << ": internal error: " << e.what() << "\n";
      return 1;
    }
  }
  std::cerr << prog << ": unknown command '" << args[0] << "'\n";
  usage(std::cerr);
  return 2;
}

}  // namespace kvsim::cli
