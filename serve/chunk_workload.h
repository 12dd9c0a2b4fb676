#pragma once
// Chunked serving workloads (docs/chunk-states.md): request traces whose prompts are a shared
// system chunk, then reusable chunks drawn by Zipf popularity, then a question never cached.
//   rag:   each request retrieves `per_request` distinct documents, in the retriever's order, so a
//          popular document recurs after many different paths (many states of one chunk).
//   agent: sessions of `per_request` turns; each turn repeats the session's chunks so far and adds
//          one tool output, so later turns reuse whole paths (the same states) and popular tool
//          outputs recur across sessions after other paths.
// Arrivals are Poisson at `rate` requests per second; every draw comes from `seed`.
#include <cstdint>
#include <string>
#include <vector>

namespace kvsim::serve {

enum class ChunkWorkloadKind { Rag, Agent };
ChunkWorkloadKind parse_chunk_workload(const std::string& s);  // "rag" | "agent"; throws naming --workload

struct ChunkWorkloadSpec {
  ChunkWorkloadKind kind = ChunkWorkloadKind::Rag;
  int requests = 1000;
  int pool = 200;            // distinct documents or tool outputs
  int per_request = 4;       // rag: documents per request; agent: turns per session
  double zipf = 1.0;         // the k-th most popular chunk's weight: 1 / k^zipf
  int chunk_tokens = 512;    // a pooled chunk's mean size (each drawn once in [1/2, 3/2] of it)
  int system_tokens = 256;   // the system chunk every request starts with
  int question_tokens = 32;  // per request, never cached
  int output_tokens = 128;
  double rate = 2;  // requests per second
  std::uint64_t seed = 1;
};

// The trace as JSON lines (serve/request_trace.h, read_chunked_trace). Throws naming the flag for
// a spec out of range.
std::string chunk_workload_jsonl(const ChunkWorkloadSpec& spec);

}  // namespace kvsim::serve
