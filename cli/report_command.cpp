// `kvsim report`: plots of result files in one HTML page. The work is Python (pandas, matplotlib:
// analysis/kvsim_report); this runs that package on the project venv's Python with the arguments
// unchanged, and returns its exit code.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"

namespace kvsim::cli {

namespace {

std::string setting(const char* env, const char* built_in) {
  const char* v = std::getenv(env);
  return v && *v ? v : built_in;
}

}  // namespace

int report_command(const Args& args) {
  const std::string python = setting("KVSIM_PYTHON", KVSIM_PYTHON),
                    dir = setting("KVSIM_ANALYSIS_DIR", KVSIM_ANALYSIS_DIR);
  if (!std::filesystem::exists(std::filesystem::path(dir) / "kvsim_report" / "__init__.py"))
    throw Error("the report package is not in " + dir + " (expected kvsim_report/ there; set KVSIM_ANALYSIS_DIR)");
  const char* old = std::getenv("PYTHONPATH");
  const std::string path = dir + (old && *old ? ":" + std::string(old) : "");
  std::vector<std::string> argv = {python, "-m", "kvsim_report"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> c_argv;
  for (std::string& a : argv) c_argv.push_back(a.data());
  c_argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) throw Error("kvsim report: cannot start " + python);
  if (pid == 0) {
    setenv("PYTHONPATH", path.c_str(), 1);
    execvp(c_argv[0], c_argv.data());
    _exit(127);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) < 0) throw Error("kvsim report: lost " + python);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
    throw Error(python + " could not be run (set KVSIM_PYTHON, or run scripts/setup.sh for the project venv)");
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

}  // namespace kvsim::cli
