#pragma once
// `kvsim calibrate`: fits the offline estimate of live KL (sim/estimator.h) to live runs of a
// calibration split, and applies it to sweep rows.
#include <string>
#include <vector>

#include "sim/estimator.h"
#include "verify/live_results.h"
#include "verify/sweep_results.h"

namespace kvsim {

// Joins the offline rows (their layer_out_sq from a sweep detail file) with the live rows of the
// same request, policy, parameters and budget (compressed configs only) and fits the layer
// weights. `where` names the offline files in errors.
Estimator calibrate_estimator(const std::vector<OfflineRow>& offline, const LiveResults& live, double smoothness,
                              const std::string& where);

// Throws naming `where` when both budget semantics are known and differ.
void require_same_semantics(const std::string& offline, const std::string& live, const std::string& where);

// Sets metrics["est_kl"] of every row from its layer_out_sq; throws naming `where` when a row
// has none (a detail file from an older sweep) or the layer count or mode differs.
void apply_estimator(std::vector<OfflineRow>& rows, const Estimator& e, const std::string& where);

// --estimator FILE of verify and agreement: reads it and applies it to rows carrying the sweep's
// --detail (required with it); returns the requests it was fitted on, which the agreement leaves
// out (none without an estimator).
std::vector<std::string> apply_estimator_file(std::vector<OfflineRow>& rows, const std::string& estimator,
                                              const std::string& detail);

}  // namespace kvsim
