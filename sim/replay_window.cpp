// Sliding-window layers in replay (docs/models.md). A local layer never holds more than its
// window, with or without a policy, so it is held as such: its tokens count as held bytes, its
// rows score no loss (the compressed cache equals the full one there), and no policy runs on it.
// The budget's share for the global layers is kvcache/budget.h's, shared with live verify.
#include <algorithm>

#include "core/error.h"
#include "sim/replay_internal.h"

namespace kvsim::replay_detail {

void hold_window_layer(const ModelGeometry& g, int layer, std::int64_t c, std::int64_t T, std::int64_t E,
                       bool record_keep_sets, Accumulator& a) {
  const int Hkv = g.n_kv_heads;
  const std::int64_t W = g.window(layer);
  const std::int64_t held = std::min(c, W);
  if (record_keep_sets) {
    std::vector<std::vector<std::int32_t>> kept(static_cast<std::size_t>(Hkv));
    for (auto& k : kept)
      for (std::int64_t t = c - held; t < c; ++t) k.push_back(static_cast<std::int32_t>(t));
    a.kept_sets[static_cast<std::size_t>(layer)] = std::move(kept);
  }
  for (int kv = 0; kv < Hkv; ++kv) a.mix(static_cast<std::uint64_t>(held) * 0x9E3779B97F4A7C15ull + 1);
  ++a.window_layers;
  a.window_rows += static_cast<double>(held * Hkv);
  for (std::int64_t t = 0; t < c; ++t)
    a.window_prefill[static_cast<std::size_t>(t)] += static_cast<double>(std::min(t + 1, W) * Hkv);
  for (std::int64_t i = 0; i < T - c; ++i)
    a.window_after_step[static_cast<std::size_t>(i)] += static_cast<double>(std::min(c + i + 1, W) * Hkv);
  for (int qh = 0; qh < g.n_q_heads; ++qh)
    for (std::int64_t i = 0; i < E; ++i) a.add_row(layer, qh, i, 1.0, 0.0, 0.0);
}

}  // namespace kvsim::replay_detail
