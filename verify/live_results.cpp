#include "verify/live_results.h"

#include <cmath>

#include "core/error.h"
#include "sim/csv.h"

namespace kvsim {

LiveResults read_verify_csv(const std::string& path) {
  CsvReader csv(path, {"request", "mode", "policy", "params", "budget", "live_kl", "top1", "task_score"},
                "a kvsim verify result file");
  LiveResults out;
  while (csv.next()) {
    const std::string& mode = csv.text("mode");
    if (out.mode.empty()) out.mode = mode;
    if (mode != out.mode)
      throw FormatError(csv.where() + ": mode '" + mode + "' after rows of '" + out.mode +
                        "'; one file holds one mode");
    const std::string semantics = csv.has("budget_semantics") ? csv.text("budget_semantics") : std::string();
    if (out.rows.empty()) out.semantics = semantics;
    if (semantics != out.semantics)
      throw FormatError(csv.where() + ": budget_semantics '" + semantics + "' after rows of '" + out.semantics +
                        "'; one file holds one budget semantics");
    LiveRow r{csv.text("request"),   csv.text("policy"), csv.text("params"),      csv.number("budget"),
              csv.number("live_kl"), csv.number("top1"), csv.number("task_score")};
    if (!std::isfinite(r.live_kl) || r.live_kl < 0)
      throw FormatError(csv.where() + ": column 'live_kl' is '" + csv.text("live_kl") + "', expected a number >= 0");
    out.rows.push_back(std::move(r));
  }
  if (out.rows.empty()) throw FormatError(path + ": no result rows (expected a kvsim verify result file)");
  return out;
}

}  // namespace kvsim
