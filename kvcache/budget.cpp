#include "kvcache/budget.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "policies/codec.h"

namespace kvsim {

std::string BudgetRule::name() const { return peak ? "peak/" + std::to_string(every) : "point"; }

std::optional<BudgetRule> budget_rule_from_name(const std::string& name) {
  if (name == "point") return BudgetRule{};
  if (name.rfind("peak/", 0) != 0 || name.size() == 5 || name.size() > 23) return std::nullopt;
  if (!std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; })) return std::nullopt;
  const std::int64_t every = std::stoll(name.substr(5));
  if (every < 1) return std::nullopt;
  return BudgetRule{true, every};
}

BudgetRule parse_budget_rule(const std::string& semantics, std::int64_t every) {
  if (semantics != "point" && semantics != "peak")
    throw Error("--budget-semantics is '" + semantics + "', expected point or peak");
  if (every < 1) throw Error("--reapply-every is " + std::to_string(every) + ", expected >= 1 (tokens)");
  return BudgetRule{semantics == "peak", every};
}

namespace {

// Peak semantics: the budget becomes the ceiling at every step; the policy plans below it.
void hold_at_peak(ConfigBudget& b, const Policy& policy, double fraction, std::int64_t c, const BudgetRule& rule,
                  const std::string& label) {
  const std::string who = "policy " + (label.empty() ? std::string("?") : label);
  if (policy.selects_across_layers())
    throw Error(who +
                " selects across layers at the compression point and cannot re-apply its rule per layer "
                "under --budget-semantics peak; use its per-layer level (e.g. kvzip:level=layer)");
  if (!policy.reapplies_per_layer())
    throw Error(who +
                " divides its budget over the whole model at the compression point and cannot re-apply it layer by "
                "layer under --budget-semantics peak; use point");
  if (policy.needs_repeat_pass())
    throw Error(who +
                " scores with the context reconstruction pass, which covers only the context: it cannot "
                "re-apply to later tokens under --budget-semantics peak (use kvzip_proxy)");
  const std::int64_t growth = policy.decode_growth();
  b.peak_tokens = b.tokens;
  if (growth > 1 && growth > b.peak_tokens / 2)
    throw Error(who + " lets its cache grow " + std::to_string(growth) +
                " tokens between re-tiers, more than half its "
                "peak budget of " +
                std::to_string(b.peak_tokens) + " tokens per head (budget " + std::to_string(fraction) + " of " +
                std::to_string(c) + " tokens) under --budget-semantics peak; re-tier more often (e.g. qevict:retier=" +
                std::to_string(std::max<std::int64_t>(1, b.peak_tokens / 4)) + ") or raise the budget");
  b.peak_entry_bytes = fraction * static_cast<double>(c) * b.kv_token_bytes;
  const std::int64_t headroom =
      growth > 0 ? growth : std::max<std::int64_t>(1, std::min(rule.every, b.peak_tokens / 2));
  b.reapply_every = growth > 0 ? 0 : headroom;
  b.tokens = std::max<std::int64_t>(0, b.peak_tokens - headroom);
  b.fraction = std::max(
      0.0, fraction - static_cast<double>(headroom) * b.token_bytes / (static_cast<double>(c) * b.kv_token_bytes));
}

}  // namespace

ConfigBudget config_budget(const Policy& policy, double fraction, std::int64_t tokens_at_point, int head_dim,
                           const BudgetRule& rule, const std::string& label) {
  ConfigBudget b;
  b.kv_token_bytes = codec_token_bytes(TokenCodec::Fp16, head_dim);
  b.compress = policy.respects_budget() && fraction < 1.0;
  b.fraction = fraction;
  b.token_bytes = b.kv_token_bytes + (b.compress ? policy.state_bytes_per_token() : 0.0);
  b.head_bytes = b.compress ? policy.state_bytes_per_head() : 0.0;
  b.tokens = b.compress
                 ? std::max<std::int64_t>(
                       0, static_cast<std::int64_t>(std::floor(
                              (fraction * static_cast<double>(tokens_at_point) * b.kv_token_bytes - b.head_bytes) /
                              b.token_bytes)))
                 : tokens_at_point;
  if (rule.peak && b.compress) hold_at_peak(b, policy, fraction, tokens_at_point, rule, label);
  return b;
}

double cache_bytes(const ConfigBudget& b, double rows, std::int64_t entries_per_layer, int layers) {
  return rows * b.token_bytes + b.head_bytes * static_cast<double>(layers) * static_cast<double>(entries_per_layer);
}

WindowShare window_share(const ModelGeometry& g, std::int64_t c) {
  WindowShare s;
  for (int l = 0; l < g.n_layers; ++l) {
    if (g.window(l) > 0)
      s.local_tokens += std::min<std::int64_t>(c, g.window(l));
    else
      ++s.global_layers;
  }
  s.held_tokens = s.local_tokens + static_cast<std::int64_t>(s.global_layers) * c;
  return s;
}

double global_fraction(double budget, const WindowShare& s, std::int64_t c, const std::string& label) {
  if (s.local_tokens == 0 || budget >= 1.0) return budget;
  if (s.global_layers == 0) return 1.0;  // every layer is local: nothing grows, nothing to compress
  const double f = (budget * static_cast<double>(s.held_tokens) - static_cast<double>(s.local_tokens)) /
                   (static_cast<double>(s.global_layers) * static_cast<double>(c));
  if (f <= 0)
    throw Error(label + " at budget " + std::to_string(budget) + ": the sliding-window layers alone hold " +
                std::to_string(static_cast<double>(s.local_tokens) / static_cast<double>(s.held_tokens)) +
                " of the cache's bytes; expected a budget above that share");
  return f;
}

void check_window_support(const ModelGeometry& g, const Policy& policy, const std::string& label,
                          const std::string& where) {
  if (std::none_of(g.sliding_window.begin(), g.sliding_window.end(), [](int w) { return w > 0; })) return;
  if (policy.selects_across_layers())
    throw Error(label + ": selects across layers, which is not supported on sliding-window models yet (" + where + ")");
}

void check_window_peak(const ModelGeometry& g, const BudgetRule& rule, std::int64_t c, const std::string& where) {
  if (!rule.peak) return;
  for (int l = 0; l < g.n_layers; ++l)
    if (g.window(l) > c)
      throw Error(where +
                  ": peak budget semantics need every sliding window full at the compression point, but layer " +
                  std::to_string(l) + "'s window of " + std::to_string(g.window(l)) + " tokens holds only " +
                  std::to_string(c) + " there and would grow past the budget while decoding; use prompts longer " +
                  "than the window, or point semantics");
}

}  // namespace kvsim
