#pragma once
// The engine's KV cache, shaped for compression: per layer, one entry per KV head (or, after a
// per-query-head plan, one per query head, each with its own copy), each holding the token
// indices it keeps, increasing, with their post-RoPE K/V rows. Values are f16-rounded floats:
// the cache holds exactly what an fp16 cache (llama.cpp's default) would, and what a trace
// stores, so live and offline policies see the same numbers.
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace kvsim {

struct PackedEntry;  // core/packed_kv.h

struct KvEntry {
  std::vector<std::int32_t> tokens;  // token indices, increasing
  std::vector<float> k, v;           // [tokens, head_dim] row-major
  // When a codec encoded the entry: what a really compressed cache stores for its first
  // packed->rows() rows (k and v hold their read-back). A backend that holds packed entries keeps
  // this instead of those rows; rows appended later are fp16. Any edit that removes rows drops it.
  std::shared_ptr<const PackedEntry> packed;
  // Soft gating (a sigmoid_gate:soft=1 run): a bias added to each row's attention logit, log g of
  // its gate; rows appended later get 0. Empty: none. Keep and evict carry it with the rows.
  std::vector<float> bias;
  std::int64_t rows() const { return static_cast<std::int64_t>(tokens.size()); }
};

struct KvCache {
  int head_dim = 0;
  std::int64_t seen = 0;                     // tokens the request has run through
  std::vector<std::vector<KvEntry>> layers;  // [layer][entry]

  // Keeps, in `layer`, only the listed tokens of each entry. `keep` has one list per current
  // entry, or one per query head when the entries are KV heads (each query head of a group then
  // gets its own copy of its KV head's rows). Throws naming a token that is not cached.
  void keep(int layer, const std::vector<std::vector<std::int32_t>>& keep, int n_q_heads);
  // Drops `tokens` (each must be cached) from one entry.
  void evict(int layer, int entry, std::span<const std::int32_t> tokens);
  std::int64_t entries_rows() const;
  // Empty: `layers` layers of `kv_heads` entries, their memory released (a compressed cache may
  // have grown per-query-head copies).
  void clear(int layers, int kv_heads);
  void reserve(std::int64_t tokens);  // room for this many rows in every entry  // K/V rows over every layer and entry
                                      // (each copy counts)
};

}  // namespace kvsim
