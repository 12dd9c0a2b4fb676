#pragma once
// A sweep as a fuzz target runs one: no progress, the results in a scratch file of the target's
// own (fuzz_input.h). What the targets that end in "then sweep it" share.
#include <sstream>
#include <string>
#include <vector>

#include "fuzz/fuzz_input.h"
#include "sim/sweep.h"

namespace kvsim::fuzz {

inline SweepSpec quiet_sweep(const std::vector<std::string>& traces, const std::vector<std::string>& policies,
                             const std::vector<double>& budgets, const std::string& out_name) {
  SweepSpec spec;
  spec.traces = traces;
  spec.policies = policies;
  spec.budgets = budgets;
  spec.out_csv = output_file(out_name);
  spec.progress = false;
  return spec;
}

inline void run_quiet(const SweepSpec& spec) {
  std::ostringstream progress;
  (void)run_sweep(spec, progress);
}

}  // namespace kvsim::fuzz
