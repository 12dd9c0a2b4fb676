#include "verify/live_results.h"

#include <cmath>

#include "core/error.h"
#include "results/verify_file.h"

namespace kvsim {

LiveResults read_verify_csv(const std::string& path) {
  LiveResults out;
  for (const results::VerifyRow& x : results::read_verify_file(path).rows) {
    const std::string where = path + ":" + std::to_string(x.line);
    if (out.mode.empty()) out.mode = x.mode;
    if (x.mode != out.mode)
      throw FormatError(where + ": mode '" + x.mode + "' after rows of '" + out.mode + "'; one file holds one mode");
    if (out.rows.empty()) out.semantics = x.budget_semantics;
    if (x.budget_semantics != out.semantics)
      throw FormatError(where + ": budget_semantics '" + x.budget_semantics + "' after rows of '" + out.semantics +
                        "'; one file holds one budget semantics");
    if (!std::isfinite(x.live_kl) || x.live_kl < 0)
      throw FormatError(where + ": column 'live_kl' is '" + std::to_string(x.live_kl) + "', expected a number >= 0");
    out.rows.push_back(LiveRow{x.request, x.policy, x.params, x.budget, x.live_kl, x.top1, x.task_score});
  }
  if (out.rows.empty()) throw FormatError(path + ": no result rows (expected a kvsim verify result file)");
  return out;
}

}  // namespace kvsim
