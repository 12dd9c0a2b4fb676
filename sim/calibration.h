#pragma once
// Calibration bases for the low-rank policies (basis=FILE): principal directions of the pre-RoPE
// keys and of the values of every prompt token of some traces, per (layer, KV head).
#include <string>
#include <vector>

#include "policies/basis_set.h"

namespace kvsim {

// Uses at most `requests_per_trace` requests of each trace (0: all); the traces must share one
// model's geometry (else an error naming the trace).
BasisSet fit_calibration_bases(const std::vector<std::string>& traces, int requests_per_trace = 0);

}  // namespace kvsim
