// Fuzz target: policy specs as `kvsim sweep -p ... -b ...` reads them (cli/options.cpp,
// policies/params.cpp, policies/registry.cpp). The input's first line is the -p value, its
// second the -b value; the policies then run on a small synthetic trace, so a parameter the
// parser let through (a window of 0, a ratio of 1e300) meets the policy's code. Seeds: every
// registered policy with its default parameters, which this target writes when
// KVSIM_FUZZ_WRITE_SEEDS=DIR is set (make_corpus.sh).
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "cli/options.h"
#include "core/error.h"
#include "fuzz/fuzz_input.h"
#include "fuzz/small_trace.h"
#include "policies/registry.h"
#include "fuzz/quiet_sweep.h"
#include "sim/sweep.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* dir = std::getenv("KVSIM_FUZZ_WRITE_SEEDS");
  if (!dir) return 0;
  for (const kvsim::PolicyInfo* p : kvsim::PolicyRegistry::instance().all()) {
    std::string spec = p->name;
    for (const auto& param : p->params) spec += (spec == p->name ? ":" : ",") + param.key + "=" + param.default_value;
    std::ofstream(std::string(dir) + "/" + p->name) << spec << "\n0.25,0.5\n";
  }
  std::exit(0);
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const std::size_t nl = input.find('\n');
  std::string budgets = nl == std::string::npos ? "0.3" : input.substr(nl + 1);
  if (const std::size_t end = budgets.find('\n'); end != std::string::npos) budgets.resize(end);
  try {
    const kvsim::SweepSpec spec =
        kvsim::fuzz::quiet_sweep({kvsim::fuzz::small_trace()}, kvsim::cli::split_policies(input.substr(0, nl)),
                                 kvsim::cli::parse_budgets(budgets), "policy_spec.csv");
    if (spec.policies.size() > 8 || spec.budgets.size() > 8) return 0;  // keep each execution short
    kvsim::fuzz::run_quiet(spec);
  } catch (const kvsim::Error&) {
  }
  return 0;
}
