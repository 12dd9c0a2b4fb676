#include "prompts/chunk_alone.h"

#include <cmath>

#include "core/half.h"
#include "core/rope.h"

namespace kvsim {

const ChunkAlone::Kept& ChunkAlone::alone(const Prompt& p, const ChunkSpan& span) {
  const std::int64_t h = p.chunks.front().begin;
  const std::vector<std::int32_t> header(p.tokens.begin(), p.tokens.begin() + h),
      tokens(p.tokens.begin() + span.begin, p.tokens.begin() + span.end);
  const auto found = kept_.find(span.id);
  if (found != kept_.end() && found->second.header == header && found->second.tokens == tokens) return found->second;
  engine_.reset();
  engine_.reserve(h + static_cast<std::int64_t>(tokens.size()));
  // Passes as a chunked prompt's prefill makes them: the header's, then the chunk's own.
  engine_.prefill(header, prefill_chunk_);
  engine_.prefill(tokens, prefill_chunk_);
  Kept kept{header, tokens, {}};
  const KvCache& cache = engine_.cache();
  const auto skip = static_cast<std::ptrdiff_t>(h * cache.head_dim);
  for (const auto& entries : cache.layers) {
    auto& k = kept.rows.k.emplace_back();
    auto& v = kept.rows.v.emplace_back();
    for (const KvEntry& e : entries) {
      k.emplace_back(e.k.begin() + skip, e.k.end());
      v.emplace_back(e.v.begin() + skip, e.v.end());
    }
  }
  return kept_[span.id] = std::move(kept);
}

ChunkAlone::Rows ChunkAlone::moved(const Prompt& p, const ChunkSpan& span) {
  Rows out = alone(p, span).rows;
  const ModelConfig& g = engine_.config();
  const std::int64_t shift = span.begin - p.chunks.front().begin;  // from after the header to here
  const auto d = static_cast<std::size_t>(g.head_dim);
  for (std::size_t l = 0; l < out.k.size(); ++l) {
    const RopeSpec rope = g.rope_at(static_cast<int>(l));
    for (std::vector<float>& k : out.k[l]) {
      for (std::size_t r = 0; r * d < k.size(); ++r) apply_rope(rope, k.data() + r * d, 1, std::abs(shift), shift < 0);
      round_to_half(k.data(), k.size());
    }
  }
  return out;
}

}  // namespace kvsim
