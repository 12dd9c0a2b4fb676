#pragma once
// Command-line parsing shared by every subcommand: parse, print help on --help, then check
// required options (so --help works without them).
#include <boost/program_options.hpp>
#include <iostream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/split.h"

namespace kvsim::cli {

// The flags every command that writes a file takes, meaning the same everywhere (cli/README.md):
// --force replaces an existing output, which is refused otherwise; -q/--quiet prints no progress
// lines or notes (stderr), while results and tables still go to stdout. Adds those `desc` lacks.
void add_output_flags(boost::program_options::options_description& desc);
// Throws naming `path` and --force when it exists and `force` is false.
void refuse_overwrite(const std::string& path, bool force);
// Silences std::cerr until the command returns (dispatch restores it before reporting an error).
void quiet_stderr();

// False when --help was asked for (the help is printed); throws po::error on bad options. With
// -q given, stderr is quiet from here on.
inline bool parse_options(const Args& args, const boost::program_options::options_description& desc,
                          const boost::program_options::positional_options_description& pos,
                          boost::program_options::variables_map& vm, const std::string& usage_line) {
  namespace po = boost::program_options;
  po::store(po::command_line_parser(args).options(desc).positional(pos).run(), vm);
  if (vm.count("help")) {
    std::cout << "usage: " << usage_line << "\n\n" << desc;
    return false;
  }
  po::notify(vm);
  if (vm.count("quiet")) quiet_stderr();
  return true;
}

// Comma- or semicolon-separated option values.
using kvsim::split;
// Policies are separated by ';' or by ',' before a token that is not key=value, so that
// "snapkv:window=64,kernel=7,h2o" reads as two policies.
std::vector<std::string> split_policies(const std::string& s);
// "0.1,0.25,0.5"; throws naming a value that is not a number.
std::vector<double> parse_budgets(const std::string& s);

}  // namespace kvsim::cli
