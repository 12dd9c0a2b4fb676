#include "prompts/repeat_pass.h"

#include <algorithm>
#include <utility>

#include "model/engine.h"
#include "model/tokenizer.h"
#include "core/error.h"
#include "core/half.h"

namespace kvsim {

std::pair<std::int64_t, std::int64_t> context_span(const Prompt& p) {
  std::int64_t begin = -1, end = -1;
  for (std::int64_t t = 0; t < p.question_start; ++t)
    if (p.segments[static_cast<std::size_t>(t)] == static_cast<std::int8_t>(Segment::Context)) {
      if (begin < 0) begin = t;
      end = t + 1;
    }
  if (begin < 0) return {p.question_start, p.question_start};
  return {begin, end};
}

namespace {

void append_rounded(std::vector<float>& dst, std::span<const float> src) {
  std::vector<std::uint16_t> h(src.size());
  floats_to_halves(src.data(), h.data(), src.size());
  const std::size_t at = dst.size();
  dst.resize(at + src.size());
  halves_to_floats(h.data(), dst.data() + at, src.size());
}

}  // namespace

RepeatPass run_repeat_pass(Engine& model, const Tokenizer& tok, const Prompt& p, int chunk_tokens) {
  if (chunk_tokens < 1) throw Error("repeat pass: chunk size must be >= 1");
  const auto [begin, end] = context_span(p);
  if (model.cached_tokens() != end)
    throw Error("repeat pass: the cache holds " + std::to_string(model.cached_tokens()) +
                " tokens, expected the prompt up to "
                "the context's end (" +
                std::to_string(end) + ")");
  const ModelConfig& c = model.config();
  RepeatPass out;
  out.q.assign(static_cast<std::size_t>(c.n_layers), {});
  out.k.assign(static_cast<std::size_t>(c.n_layers), {});
  if (begin == end) return out;
  const KvCache saved = std::as_const(model).cache();
  const std::vector<std::int32_t> suffix = tok.encode(tok.chat_tail());
  for (std::int64_t cb = begin; cb < end; cb += chunk_tokens) {
    const std::int64_t ce = std::min<std::int64_t>(end, cb + chunk_tokens);
    std::vector<std::int32_t> ids;
    if (cb == begin) {
      ids = tok.encode("\n\nRepeat the previous context exactly.");
    } else {
      ids = tok.encode("\n\nRepeat the part of the previous context exactly, starting with");
      const std::int64_t from = std::max(begin, cb - kRepeatPrefixTokens);
      ids.insert(ids.end(), p.tokens.begin() + from, p.tokens.begin() + cb);
    }
    ids.insert(ids.end(), suffix.begin(), suffix.end());
    ids.insert(ids.end(), p.tokens.begin() + cb, p.tokens.begin() + ce);
    std::vector<std::int32_t> pos(ids.size());
    for (std::size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<std::int32_t>(end + static_cast<std::int64_t>(i));
    RepeatChunk chunk{cb, ce, out.rows, out.rows + static_cast<std::int64_t>(ids.size())};
    auto hook = [&](const LayerActivations& a) {
      append_rounded(out.q[static_cast<std::size_t>(a.layer)], a.q);
      append_rounded(out.k[static_cast<std::size_t>(a.layer)], a.k);
    };
    // In pieces of at most 256 rows, as the engine prefills; the pass's rows attend causally to
    // each other and to the whole prompt cache.
    for (std::size_t s = 0; s < ids.size(); s += 256) {
      const std::size_t n = std::min<std::size_t>(256, ids.size() - s);
      model.forward(std::span(ids).subspan(s, n), std::span(pos).subspan(s, n), {}, hook);
    }
    model.set_cache(saved);
    out.chunks.push_back(chunk);
    out.rows = chunk.row_end;
  }
  return out;
}

}  // namespace kvsim
