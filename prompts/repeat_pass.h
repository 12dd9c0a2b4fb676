#pragma once
// KVzip's context-reconstruction pass (methods.md §8; snu-mllab/KVzip): on top of the cache that
// holds the prompt up to the question, the model is teacher-forced to repeat the context, chunk by
// chunk ("Repeat the previous context exactly." + the assistant turn + the chunk; later chunks
// "Repeat the part of the previous context exactly, starting with" + the previous chunk's last 8
// tokens). The pass's queries and keys are what KVzip scores the context with; the cache is
// restored after each chunk, so the request itself runs as without the pass. Shared by capture
// (which records it in the trace) and live verify (which hands it to the policies).
#include <cstdint>
#include <vector>

#include "prompts/prompt.h"
#include "traces/trace_schema.h"

namespace kvsim {

class Engine;
class Tokenizer;

constexpr int kRepeatChunkTokens = 2000;  // KVzip's chunk size C
constexpr int kRepeatPrefixTokens = 8;    // tokens of the previous chunk quoted by the next prompt

// The context of a prompt: its Context-segment tokens before the question, [begin, end).
std::pair<std::int64_t, std::int64_t> context_span(const Prompt& p);

// Runs the pass on `model`, whose cache holds exactly the prompt's tokens [0, context end), and
// returns its post-RoPE queries and keys (f16-rounded, as a trace stores them) with the chunk table.
RepeatPass run_repeat_pass(Engine& model, const Tokenizer& tok, const Prompt& p, int chunk_tokens = kRepeatChunkTokens);

}  // namespace kvsim
