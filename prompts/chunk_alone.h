#pragma once
// Each chunk of a chunked prompt computed alone: after the prompt's header only, in passes of its
// own (docs/chunk-states.md). Computed once per chunk (and header) and kept for every prompt that
// holds it; handed out with the keys moved to the chunk's positions in a given prompt. Capture
// records it (`--chunk-states`) and live verify serves it (chunk reuse).
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model/engine.h"
#include "prompts/prompt.h"

namespace kvsim {

class ChunkAlone {
 public:
  ChunkAlone(Engine& engine, std::int64_t prefill_chunk) : engine_(engine), prefill_chunk_(prefill_chunk) {}
  // Per layer and KV head, the chunk's K and V rows [span tokens, head_dim] computed alone, the
  // keys rotated from their positions after the header to the span's in p and rounded to f16 as
  // the cache holds them. Runs the engine (its cache is lost) when the chunk is not kept yet.
  struct Rows {
    std::vector<std::vector<std::vector<float>>> k, v;  // [layer][kv head]
  };
  Rows moved(const Prompt& p, const ChunkSpan& span);

 private:
  struct Kept {
    std::vector<std::int32_t> header, tokens;  // what it was computed from
    Rows rows;                                 // at positions after the header
  };
  const Kept& alone(const Prompt& p, const ChunkSpan& span);
  Engine& engine_;
  std::int64_t prefill_chunk_;
  std::map<std::string, Kept> kept_;
};

}  // namespace kvsim
