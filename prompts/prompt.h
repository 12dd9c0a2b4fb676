#pragma once
// A request as the model sees it: ChatML turns (system, user context + question, assistant),
// each part tokenized on its own so every token knows its segment. Shared by capture and verify
// so both run exactly the same tokens.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "prompts/request_file.h"

namespace kvsim {

class GgufFile;
class Tokenizer;

// A request chunk's tokens in the prompt: [begin, end).
struct ChunkSpan {
  std::string id;
  std::int64_t begin = 0, end = 0;
};

struct Prompt {
  std::vector<std::int32_t> tokens;
  std::vector<std::int8_t> segments;  // Segment codes
  std::int64_t question_start = 0, needle_start = -1, needle_end = -1;
  std::vector<ChunkSpan> chunks;  // a chunked request's chunks, in order (the context is theirs)
};

// The system turn a request without one gets: what the model family's own chat template inserts.
std::string default_system_prompt(const GgufFile& gguf);

Prompt build_prompt(const Tokenizer& tok, const CaptureRequest& r, const std::string& default_system);

// Where every prefill of p starts a fresh pass: the question's start, and a chunked prompt's
// chunk boundaries (so a chunk is computed in passes of its own, alone or in context: the same
// shapes, docs/chunk-states.md).
std::vector<std::int64_t> prompt_splits(const Prompt& p);

// Prefill chunks [begin, end) over [0, end): `chunk` tokens at a time, with a boundary at every
// split too (the question's start; live verify's compression cuts), counting afresh from each, so
// a run that stops at the question (query-agnostic verify) computes the context exactly as a
// capture that runs on did.
std::vector<std::pair<std::int64_t, std::int64_t>> prefill_chunks(std::int64_t end,
                                                                  const std::vector<std::int64_t>& splits,
                                                                  std::int64_t chunk);

// The strings a free generation should contain: the request's `expected` list, else its answer.
std::vector<std::string> expected_strings(const CaptureRequest& r);

}  // namespace kvsim
