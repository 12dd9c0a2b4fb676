#pragma once
// A serving cost profile: one model on one device. Prefill of a batch costs a + b*sum(l) +
// c*sum(l^2) over its sequences' new tokens l; a decode step costs a + b*sum(ctx) + c*B over its B
// sequences' context lengths. Profiles are JSON files: fitted from kvsim's own engine (`kvsim serve
// profile`) or built in from public specs (docs/serving.md says how each was derived).
#include <cstdint>
#include <string>
#include <vector>

#include "serve/cost_model.h"

namespace kvsim::serve {

struct DecodeCost {
  double a_ms = 0, b_ms_per_ctx_token = 0, c_ms_per_seq = 0;
  double step_ms(double sum_ctx, std::int64_t batch) const {
    return batch > 0 ? a_ms + b_ms_per_ctx_token * sum_ctx + c_ms_per_seq * static_cast<double>(batch) : 0.0;
  }
};

struct ServeProfile {
  std::string name, source;  // source: "fitted: ..." or "public specs: ..."
  PrefillCost prefill;
  DecodeCost decode;
  double kv_bytes_per_token = 0;  // K and V over every layer, fp16
};

// The profiles built in: llama2-7b-h100, llama2-7b-h200.
const std::vector<ServeProfile>& builtin_profiles();
// A built-in name, or a JSON file written by write_profile. Throws naming the file and field.
ServeProfile load_profile(const std::string& name_or_path);
void write_profile(const ServeProfile& p, const std::string& path);

// One measured run: `tokens` new tokens (prefill) or context tokens (decode), `batch` sequences.
struct CostSample {
  double tokens = 0, tokens2 = 0;  // sum(l), sum(l^2) for prefill; sum(ctx) for decode
  double batch = 1;
  double ms = 0;
};
// Least squares fit of a + b*x1 + c*x2 with every coefficient >= 0 (the best of the fits with each
// subset of coefficients held at 0). Prefill: x1 = tokens, x2 = tokens2. Decode: x1 = tokens,
// x2 = batch. Returns {a, b, c}; throws when no subset of coefficients fits (no samples). Equal
// fits keep the intercept before the batch term (one batch size cannot tell them apart).
std::vector<double> fit_nonnegative(const std::vector<CostSample>& samples, bool decode);

}  // namespace kvsim::serve
