#include "verify/chunk_reuse.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace kvsim {

std::string ReuseConfig::label() const {
  if (way == ReuseWay::Recompute) return "recompute";
  if (way == ReuseWay::Stateless) return "stateless";
  char buf[48];
  std::snprintf(buf, sizeof buf, "transition:share=%g", share);
  return buf;
}

std::string ReuseConfig::params() const {
  const std::string l = label();
  return way == ReuseWay::Transition ? "way=transition,share=" + l.substr(l.find('=') + 1) : "way=" + l;
}

ReuseConfig parse_reuse(const std::string& spec) {
  ReuseConfig c;
  if (spec == "recompute" || spec == "stateless") {
    c.way = spec == "recompute" ? ReuseWay::Recompute : ReuseWay::Stateless;
    return c;
  }
  const std::string prefix = "transition:share=";
  if (spec.rfind(prefix, 0) == 0) {
    c.way = ReuseWay::Transition;
    std::size_t used = 0;
    try {
      c.share = std::stod(spec.substr(prefix.size()), &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used > 0 && used == spec.size() - prefix.size() && c.share >= 0 && c.share <= 1) return c;
  }
  throw Error("--chunk-reuse: '" + spec + "'; expected recompute | stateless | transition:share=S with S in [0, 1]");
}

namespace {

// Every entry of `full` must hold the tokens [0, c), one row each: the uncompressed cache.
void check_full(const KvCache& full, std::int64_t c, int kv_heads, const std::string& where) {
  for (std::size_t l = 0; l < full.layers.size(); ++l) {
    const auto& entries = full.layers[l];
    bool ok = static_cast<int>(entries.size()) == kv_heads;
    for (const KvEntry& e : entries)
      ok = ok && e.rows() == c && (c == 0 || (e.tokens.front() == 0 && e.tokens.back() == c - 1));
    if (!ok)
      throw Error(where + ": layer " + std::to_string(l) + " of the cache at the question is compressed; chunk reuse " +
                  "needs every token of the context in every KV head");
  }
}

// The top `share` of rows by deviation (ties: the earlier row), increasing.
std::vector<std::int64_t> top_share(const std::vector<double>& deviation, double share) {
  const auto n = static_cast<std::int64_t>(deviation.size());
  const auto k = static_cast<std::int64_t>(std::llround(share * static_cast<double>(n)));
  std::vector<std::int64_t> rows(static_cast<std::size_t>(n));
  std::iota(rows.begin(), rows.end(), 0);
  std::stable_sort(rows.begin(), rows.end(), [&](std::int64_t a, std::int64_t b) {
    return deviation[static_cast<std::size_t>(a)] > deviation[static_cast<std::size_t>(b)];
  });
  rows.resize(static_cast<std::size_t>(k));
  std::sort(rows.begin(), rows.end());
  return rows;
}

}  // namespace

KvCache ChunkStates::serve(const Prompt& p, std::int64_t c, const KvCache& full, const ReuseConfig& way,
                           ReuseStats& stats, const std::string& where) {
  const ModelConfig& g = engine_.config();
  if (p.chunks.empty()) throw Error(where + ": --chunk-reuse needs a chunked request (field 'chunks')");
  if (c != p.chunks.back().end)
    throw Error(where + ": chunk reuse runs at the question's start (query-agnostic mode): the cache is at token " +
                std::to_string(c) + ", the chunks end at " + std::to_string(p.chunks.back().end));
  check_full(full, c, g.n_kv_heads, where);
  const std::int64_t h = p.chunks.front().begin;
  stats.chunk_tokens = c - h;
  stats.recomputed = way.way == ReuseWay::Recompute ? c - h : 0;
  if (way.way == ReuseWay::Recompute) return full;
  KvCache out = full;
  const auto d = static_cast<std::ptrdiff_t>(g.head_dim);
  for (const ChunkSpan& span : p.chunks) {
    const ChunkAlone::Rows rows = alone_.moved(p, span);
    for (std::size_t l = 0; l < rows.k.size(); ++l)
      for (std::size_t e = 0; e < rows.k[l].size(); ++e) {
        KvEntry& dst = out.layers[l][e];
        std::copy(rows.k[l][e].begin(), rows.k[l][e].end(), dst.k.begin() + span.begin * d);
        std::copy(rows.v[l][e].begin(), rows.v[l][e].end(), dst.v.begin() + span.begin * d);
      }
  }
  if (way.way == ReuseWay::Stateless) return out;
  engine_.set_cache(out);
  const std::vector<std::int32_t> tokens(p.tokens.begin() + h, p.tokens.begin() + c);
  std::vector<std::int32_t> positions(tokens.size());
  std::iota(positions.begin(), positions.end(), static_cast<std::int32_t>(h));
  const std::vector<std::int64_t> indices(positions.begin(), positions.end());
  RefreshOptions o;
  o.select = [&](const std::vector<double>& deviation) { return top_share(deviation, way.share); };
  for (const auto& [b, e] : prefill_chunks(c, prompt_splits(p), prefill_chunk_))  // prefill's passes, as rows
    if (b >= h) o.batches.emplace_back(b - h, e - h);
  stats.recomputed = static_cast<std::int64_t>(engine_.refresh(tokens, positions, indices, o).selected.size());
  return engine_.cache();
}

}  // namespace kvsim
