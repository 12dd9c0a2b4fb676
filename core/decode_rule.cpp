#include "core/decode_rule.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace kvsim {

void check_rule_start(const DecodeRuleStart& start, const std::vector<std::int64_t>& rows, int n_heads) {
  const DecodeRule& r = start.rule;
  if (r.protect_newest < 0) throw std::invalid_argument("decode rule: protect_newest is negative");
  if (rows.empty() || n_heads % static_cast<int>(rows.size()) != 0)
    throw std::invalid_argument("decode rule: " + std::to_string(rows.size()) + " entries for " +
                                std::to_string(n_heads) + " query heads");
  if (r.layer_wide)
    for (const auto n : rows)
      if (n != rows[0])
        throw std::invalid_argument("decode rule: a layer-wide rule needs entries of equal rows, found " +
                                    std::to_string(rows[0]) + " and " + std::to_string(n));
  const std::size_t want = r.layer_wide ? 1 : rows.size();
  if (!r.accumulate) return;
  if (start.scores.size() != want)
    throw std::invalid_argument("decode rule: scores for " + std::to_string(start.scores.size()) +
                                " entries, expected " + std::to_string(want));
  for (std::size_t e = 0; e < want; ++e)
    if (static_cast<std::int64_t>(start.scores[e].size()) != rows[e])
      throw std::invalid_argument("decode rule: entry " + std::to_string(e) + " holds " + std::to_string(rows[e]) +
                                  " rows, its scores cover " + std::to_string(start.scores[e].size()));
}

std::vector<std::uint8_t> lowest_rows(const std::vector<double>& scores, std::int64_t candidates, std::int64_t count) {
  std::vector<std::uint8_t> gone(scores.size(), 0);
  candidates = std::min<std::int64_t>(candidates, static_cast<std::int64_t>(scores.size()));
  for (; count > 0; --count) {
    std::int64_t worst = -1;
    for (std::int64_t m = 0; m < candidates; ++m)
      if (!gone[static_cast<std::size_t>(m)] &&
          (worst < 0 || scores[static_cast<std::size_t>(m)] < scores[static_cast<std::size_t>(worst)]))
        worst = m;
    if (worst < 0) break;
    gone[static_cast<std::size_t>(worst)] = 1;
  }
  return gone;
}

std::vector<std::vector<std::int64_t>> decode_rule_step_ref(const DecodeRule& rule,
                                                            std::vector<std::vector<double>>& scores,
                                                            const std::vector<std::int64_t>& rows,
                                                            const LastRowWeights& w, std::int64_t budget) {
  const auto entries = rows.size();
  if (entries == 0 || w.heads_per_entry * static_cast<int>(entries) != w.n_heads)
    throw std::invalid_argument("decode rule step: " + std::to_string(entries) + " entries of " +
                                std::to_string(w.heads_per_entry) + " query heads, but " + std::to_string(w.n_heads) +
                                " heads of weights");
  const std::size_t scored = rule.layer_wide ? 1 : entries;
  if (rule.layer_wide)
    for (const auto n : rows)
      if (n != rows[0]) throw std::invalid_argument("decode rule step: a layer-wide rule over entries of unequal rows");
  if (rule.accumulate && scores.size() != scored)
    throw std::invalid_argument("decode rule step: scores for " + std::to_string(scores.size()) +
                                " entries, expected " + std::to_string(scored));
  std::vector<std::vector<std::int64_t>> evicted(entries);
  for (std::size_t e = 0; e < scored; ++e) {
    const std::int64_t n = rows[e];
    if (n > w.stride) throw std::invalid_argument("decode rule step: entry rows past the weights' stride");
    std::vector<double> fresh;
    std::vector<double>& sc = rule.accumulate ? scores[e] : fresh;
    if (rule.accumulate && static_cast<std::int64_t>(sc.size()) + 1 != n)
      throw std::invalid_argument("decode rule step: entry " + std::to_string(e) + " holds " + std::to_string(n) +
                                  " rows, its scores cover " + std::to_string(sc.size()) + " (one new row expected)");
    sc.resize(static_cast<std::size_t>(n), 0.0);  // the new row (or every row, not accumulating) starts from 0
    const int h0 = rule.layer_wide ? 0 : static_cast<int>(e) * w.heads_per_entry;
    const int nh = rule.layer_wide ? w.n_heads : w.heads_per_entry;
    for (std::int64_t m = 0; m < n; ++m) {
      double add = 0.0;  // weights are >= 0, so 0 also starts a max
      for (int h = h0; h < h0 + nh; ++h) {
        const double x =
            w.data[static_cast<std::size_t>(h) * static_cast<std::size_t>(w.stride) + static_cast<std::size_t>(m)];
        add = rule.combine == HeadCombine::Max ? std::max(add, x) : add + x;
      }
      sc[static_cast<std::size_t>(m)] += rule.combine == HeadCombine::Mean ? add / nh : add;
    }
    const std::vector<std::uint8_t> gone = lowest_rows(sc, n - rule.protect_newest, n - budget);
    std::size_t out = 0;
    for (std::int64_t m = 0; m < n; ++m) {
      if (gone[static_cast<std::size_t>(m)]) {
        evicted[e].push_back(m);
      } else {
        sc[out++] = sc[static_cast<std::size_t>(m)];
      }
    }
    sc.resize(out);
  }
  if (rule.layer_wide)
    for (std::size_t e = 1; e < entries; ++e) evicted[e] = evicted[0];
  return evicted;
}

}  // namespace kvsim
