#include "learned/head_allocation.h"

#include <algorithm>
#include <numeric>

namespace kvsim::learned {

HeadAllocation allocate_heads(const std::vector<double>& gates, const std::vector<std::int64_t>& n, std::int64_t total,
                              std::int64_t sinks, std::int64_t recent) {
  const std::size_t H = n.size();
  HeadAllocation a{std::vector<std::int64_t>(H, 0), std::vector<std::uint8_t>(H, 0)};
  std::vector<std::size_t> order(H);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) { return gates[x] > gates[y]; });
  std::vector<std::int64_t> stream(H);
  for (std::size_t h = 0; h < H; ++h) stream[h] = std::min(n[h], sinks + recent);
  // The most heads kept whole while every other head still gets its streaming window.
  std::int64_t used = std::accumulate(stream.begin(), stream.end(), std::int64_t{0});
  std::size_t k = 0;
  while (k < H && used - stream[order[k]] + n[order[k]] <= total) {
    used += n[order[k]] - stream[order[k]];
    a.full[order[k]] = 1;
    ++k;
  }
  std::int64_t left = total;
  if (used > total) {  // not even the streaming windows fit: split the budget evenly
    for (std::size_t h = 0; h < H; ++h) left -= a.keep[h] = std::min(n[h], total / static_cast<std::int64_t>(H));
  } else {
    for (std::size_t h = 0; h < H; ++h) a.keep[h] = a.full[h] ? n[h] : stream[h];
    left = total - used;
  }
  // The rest of the budget widens the streaming heads' windows, one token at a time round robin
  // in gate order (heads already holding everything are skipped).
  bool grew = true;
  while (left > 0 && grew) {
    grew = false;
    for (std::size_t i = k; i < H && left > 0; ++i) {
      const std::size_t h = order[i];
      if (a.keep[h] < n[h]) ++a.keep[h], --left, grew = true;
    }
  }
  return a;
}

std::vector<std::uint8_t> streaming_mask(std::span<const std::int32_t> cached, std::int64_t sinks, std::int64_t keep) {
  std::vector<std::uint8_t> mask(cached.size(), 0);
  const std::int64_t sink = std::min(sinks, keep);
  std::int64_t kept = 0;
  for (std::size_t j = 0; j < cached.size() && kept < sink; ++j)
    if (cached[j] < sinks) mask[j] = 1, ++kept;
  for (std::size_t j = cached.size(); j-- > 0 && kept < keep;)
    if (!mask[j]) mask[j] = 1, ++kept;
  return mask;
}

}  // namespace kvsim::learned
