#include "kvcache/training_prompts.h"

#include <algorithm>

#include "core/error.h"
#include "core/fingerprint.h"

namespace kvsim::kvcache {

bool any_training_prompts(const std::vector<ReplayConfig>& configs) {
  return std::any_of(configs.begin(), configs.end(),
                     [](const ReplayConfig& c) { return !c.impl->training_prompts().empty(); });
}

void check_training_prompts(const std::vector<ReplayConfig>& configs, std::span<const std::int32_t> prompt,
                            const std::string& where, bool allowed) {
  if (allowed) return;
  std::uint64_t fingerprint = 0;
  bool computed = false;
  for (const ReplayConfig& c : configs) {
    const auto trained = c.impl->training_prompts();
    if (trained.empty()) continue;
    if (!computed) fingerprint = prompt_fingerprint(prompt), computed = true;
    if (std::find(trained.begin(), trained.end(), fingerprint) != trained.end())
      throw Error(where + ": policy " + c.label() + " was trained on this request's prompt; evaluate it on held-out " +
                  "requests, or pass --allow-training-requests to measure it on its training data");
  }
}

}  // namespace kvsim::kvcache
