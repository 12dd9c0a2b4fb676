#include "model/kv_cache.h"

#include <algorithm>
#include <iterator>
#include <string>

#include "core/error.h"

namespace kvsim {

namespace {

// The rows of `src` whose tokens are in `want` (increasing); a packed form no longer lines up
// with them and is left behind.
KvEntry select_rows(const KvEntry& src, const std::vector<std::int32_t>& want, int d, int layer) {
  KvEntry out;
  out.tokens.reserve(want.size());
  out.k.reserve(want.size() * static_cast<std::size_t>(d));
  out.v.reserve(out.k.capacity());
  std::size_t at = 0;
  for (std::int32_t t : want) {
    while (at < src.tokens.size() && src.tokens[at] < t) ++at;
    if (at == src.tokens.size() || src.tokens[at] != t)
      throw Error("KV cache, layer " + std::to_string(layer) + ": cannot keep token " + std::to_string(t) +
                  ", which is not cached (or the keep list is not increasing)");
    out.tokens.push_back(t);
    const auto row = static_cast<std::ptrdiff_t>(at * static_cast<std::size_t>(d));
    out.k.insert(out.k.end(), src.k.begin() + row, src.k.begin() + row + d);
    out.v.insert(out.v.end(), src.v.begin() + row, src.v.begin() + row + d);
    if (!src.bias.empty()) out.bias.push_back(src.bias[at]);
    ++at;
  }
  return out;
}

}  // namespace

void KvCache::keep(int layer, const std::vector<std::vector<std::int32_t>>& keep, int n_q_heads) {
  auto& entries = layers.at(static_cast<std::size_t>(layer));
  const auto n = entries.size();
  const bool expand =
      keep.size() != n && static_cast<int>(keep.size()) == n_q_heads && n_q_heads % static_cast<int>(n) == 0;
  if (keep.size() != n && !expand)
    throw Error("KV cache, layer " + std::to_string(layer) + ": plan has " + std::to_string(keep.size()) +
                " entries, expected " + std::to_string(n) + " or one per query head (" + std::to_string(n_q_heads) +
                ")");
  const std::size_t group = expand ? keep.size() / n : 1;
  std::vector<KvEntry> out;
  out.reserve(keep.size());
  for (std::size_t e = 0; e < keep.size(); ++e)
    out.push_back(select_rows(entries[e / group], keep[e], head_dim, layer));
  entries = std::move(out);
}

void KvCache::evict(int layer, int entry, std::span<const std::int32_t> tokens) {
  if (tokens.empty()) return;
  KvEntry& e = layers.at(static_cast<std::size_t>(layer)).at(static_cast<std::size_t>(entry));
  std::vector<std::int32_t> drop(tokens.begin(), tokens.end());
  std::sort(drop.begin(), drop.end());
  for (std::int32_t t : drop)
    if (!std::binary_search(e.tokens.begin(), e.tokens.end(), t))
      throw Error("KV cache, layer " + std::to_string(layer) + ", entry " + std::to_string(entry) +
                  ": cannot evict token " + std::to_string(t) + ", which is not cached");
  // In place: the rows after the first dropped one move up. A decode-time policy drops a token or
  // two from every entry each step; a new entry per eviction would copy the whole cache.
  const auto d = static_cast<std::size_t>(head_dim);
  auto out =
      static_cast<std::size_t>(std::lower_bound(e.tokens.begin(), e.tokens.end(), drop.front()) - e.tokens.begin());
  std::size_t j = 0;
  for (std::size_t r = out; r < e.tokens.size(); ++r) {
    while (j < drop.size() && drop[j] < e.tokens[r]) ++j;
    if (j < drop.size() && drop[j] == e.tokens[r]) continue;
    if (out != r) {
      e.tokens[out] = e.tokens[r];
      if (!e.bias.empty()) e.bias[out] = e.bias[r];
      std::copy_n(e.k.begin() + static_cast<std::ptrdiff_t>(r * d), d,
                  e.k.begin() + static_cast<std::ptrdiff_t>(out * d));
      std::copy_n(e.v.begin() + static_cast<std::ptrdiff_t>(r * d), d,
                  e.v.begin() + static_cast<std::ptrdiff_t>(out * d));
    }
    ++out;
  }
  e.tokens.resize(out);
  if (!e.bias.empty()) e.bias.resize(out);
  e.k.resize(out * d);
  e.v.resize(out * d);
  e.packed = nullptr;  // an edit that removes rows drops the packed form
}

std::int64_t KvCache::entries_rows() const {
  std::int64_t n = 0;
  for (const auto& l : layers)
    for (const auto& e : l) n += e.rows();
  return n;
}

void KvCache::clear(int n_layers, int kv_heads) {
  seen = 0;
  layers.assign(static_cast<std::size_t>(n_layers), std::vector<KvEntry>(static_cast<std::size_t>(kv_heads)));
}

void KvCache::reserve(std::int64_t tokens) {
  const auto n = static_cast<std::size_t>(tokens);
  for (auto& l : layers)
    for (auto& e : l) {
      e.tokens.reserve(n);
      e.k.reserve(n * static_cast<std::size_t>(head_dim));
      e.v.reserve(n * static_cast<std::size_t>(head_dim));
    }
}

}  // namespace kvsim
