#pragma once
// Chunked workloads (docs/chunk-states.md): requests whose context is a sequence of reusable
// chunks drawn by Zipf popularity from a pool, so that popular chunks recur after different
// preceding chunks. RAG: retrieved documents in the retriever's order, then a question about one
// of them. Agent: one system chunk shared by every request (its state never changes), then tool
// outputs, then a question about one of them. Every chunk holds a planted fact with a unique
// answer, so a free generation is scored by whether it holds it.
#include <cstdint>
#include <string>
#include <vector>

#include "prompts/request_file.h"

namespace kvsim {

enum class ChunkedWorkload { Rag, Agent };
ChunkedWorkload parse_chunked_workload(const std::string& s);  // "rag" | "agent"; throws naming --workload
const char* chunked_workload_name(ChunkedWorkload w);

struct ChunkedSpec {
  ChunkedWorkload workload = ChunkedWorkload::Rag;
  int requests = 16;
  int pool = 24;           // distinct chunks (documents or tool outputs)
  int per_request = 3;     // pooled chunks per request (agent: after the system chunk)
  double zipf = 1.0;       // popularity: the k-th most popular chunk is drawn with weight 1 / k^zipf
  int chunk_tokens = 256;  // per chunk, estimated at 4 characters a token
  std::string file;        // the text chunks are cut from (UTF-8)
  std::uint64_t seed = 1;
};

// Requests "<workload>-<i>" with chunks "<doc|tool>-<k>" (agent: "system" first), a question,
// expected answer and task "<workload>:contains_all". Throws naming the flag or file when the spec
// cannot be met.
std::vector<CaptureRequest> make_chunked_tasks(const ChunkedSpec& spec);

}  // namespace kvsim
