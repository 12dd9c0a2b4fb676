#pragma once
// Subcommand entry points of the `kvsim` CLI. Each takes the arguments after its own name and
// returns the process exit code: 0 success, 1 failure (bad input, failed check), 2 usage error.
#include <string>
#include <vector>

namespace kvsim::cli {

using Args = std::vector<std::string>;

int trace_command(const Args& args);
int sweep_command(const Args& args);
int model_command(const Args& args);
int capture_command(const Args& args);
int tasks_command(const Args& args);
int verify_command(const Args& args);
int calibrate_command(const Args& args);
int agreement_command(const Args& args);
int train_command(const Args& args);
int serve_command(const Args& args);
int report_command(const Args& args);

}  // namespace kvsim::cli
