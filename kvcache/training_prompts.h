#pragma once
// Learned policies are not evaluated on the prompts they were trained on unless the user asks
// (Policy::training_prompts): sweep and verify call this per request.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvcache/config.h"

namespace kvsim::kvcache {

// Whether any of `configs` is a learned policy that knows its training prompts.
bool any_training_prompts(const std::vector<ReplayConfig>& configs);

// Throws naming `where` (the trace or task file and request) and the config when one of
// `configs` was trained on `prompt`, unless `allowed`.
void check_training_prompts(const std::vector<ReplayConfig>& configs, std::span<const std::int32_t> prompt,
                            const std::string& where, bool allowed);

}  // namespace kvsim::kvcache
