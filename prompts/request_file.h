#pragma once
// The request file (JSONL): what capture records and live verify re-runs, one request per line.
// Its one reader and one writer; `kvsim tasks` writes it, capture, verify and train read it.
#include <cstdint>
#include <string>
#include <vector>

namespace kvsim {

// A reusable piece of a prompt (a document, a tool output, a system prompt): tokenized on its own,
// so its tokens are the same in every request that holds it (docs/chunk-states.md).
struct RequestChunk {
  std::string id, text;
};

struct CaptureRequest {
  std::string id, system, context, question, answer, task;
  std::vector<RequestChunk> chunks;  // when given, the context is their texts in order
  std::string expected;              // JSON array of strings the output should contain (free generation)
  std::int64_t line = 0;             // in the JSONL file, for error messages
};

// Parses JSONL: one object per line with id, context, question (strings), optional system,
// answer (teacher-forced), expected (array of strings to score free generation), task; or
// {"id", "text"} for raw text (all context); or "chunks" ([{"id", "text"}, ...], non-empty
// strings, ids unique in the request) instead of "context". Errors name the file, line and field.
std::vector<CaptureRequest> read_capture_requests(const std::string& path);

// One JSON object per line, in read_capture_requests' format; an existing file only with `overwrite`.
void write_requests_jsonl(const std::vector<CaptureRequest>& requests, const std::string& path, bool overwrite);

}  // namespace kvsim
