#pragma once
// Serving a chunked request's chunks from a state other than their own (docs/chunk-states.md):
// stateless reuse of each chunk's KV computed alone (after the header), a CacheBlend transition
// that starts from it and recomputes the share of tokens whose layer-1 K/V deviates most, or
// recompute (the reference). Live verify runs the question and continuation on the result.
#include <cstdint>
#include <string>
#include <vector>

#include "model/engine.h"
#include "prompts/chunk_alone.h"
#include "prompts/prompt.h"

namespace kvsim {

enum class ReuseWay { Recompute, Stateless, Transition };

struct ReuseConfig {
  ReuseWay way = ReuseWay::Recompute;
  double share = 0;            // transition: the share of the chunks' tokens recomputed above layer 1
  std::string label() const;   // "recompute", "stateless", "transition:share=0.15"
  std::string params() const;  // as a verify CSV row names it: "way=stateless", "way=transition,share=0.15"
};
// "recompute" | "stateless" | "transition:share=S" (S in [0, 1]); throws naming the spec.
ReuseConfig parse_reuse(const std::string& spec);

struct ReuseStats {
  std::int64_t chunk_tokens = 0;  // tokens of the request's chunks
  std::int64_t recomputed = 0;    // of them, recomputed in every layer (transition: the selected)
};

// A chunked request's context cache served a way, from each chunk's state alone (kept across
// requests, prompts/chunk_alone.h).
class ChunkStates {
 public:
  ChunkStates(Engine& engine, std::int64_t prefill_chunk)
      : engine_(engine), prefill_chunk_(prefill_chunk), alone_(engine, prefill_chunk) {}
  // The cache of p's tokens [0, c) (c: the question's start) served `way`: the header's rows and
  // the rest from `full` (an uncompressed cache of those tokens), each chunk's rows from its state
  // alone with its keys moved to its positions; a transition then refreshes the engine's copy.
  // Throws naming the request when p has no chunks or `full` is compressed.
  KvCache serve(const Prompt& p, std::int64_t c, const KvCache& full, const ReuseConfig& way, ReuseStats& stats,
                const std::string& where);

 private:
  Engine& engine_;
  std::int64_t prefill_chunk_;
  ChunkAlone alone_;
};

}  // namespace kvsim
