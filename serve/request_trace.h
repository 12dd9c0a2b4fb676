#pragma once
// Serving request traces in Mooncake's JSONL format (docs/formats: one object per line with
// `timestamp` in ms, `input_length`, `output_length` and `hash_ids`, the chained hashes of the
// prompt's 512-token blocks). Equal ids are the same prefix block, so the ids form a tree: each
// block's parent is the block before it. The reader checks that and remaps ids to dense vertex
// numbers, so the simulator indexes vectors instead of hashing on every reference.
#include <cstdint>
#include <string>
#include <vector>

namespace kvsim::serve {

constexpr std::int64_t kMooncakeBlockTokens = 512;

struct ServeRequest {
  std::int64_t line = 0;  // in the file (1-based), for messages
  double arrival_ms = 0;
  std::int64_t input_tokens = 0, output_tokens = 0;
  std::vector<std::int32_t> blocks;  // dense block ids, prompt order
  std::int64_t question_tokens = 0;  // after its blocks, never cached (a chunked request's question)
};

// A trace's blocks form a tree: a Mooncake block's parent is the block before it; a chunked
// trace's block is a chunk state (the chunk given the path of chunks before it), whose parent is
// the state before it (docs/chunk-states.md).
struct RequestTrace {
  std::string path;
  // Mooncake's block size; 0 for a chunked trace, whose blocks vary (nominal_block_tokens()).
  std::int64_t block_size = kMooncakeBlockTokens;
  std::vector<ServeRequest> requests;
  std::vector<std::int32_t> parent;       // [block] the block before it, -1 for a first block
  std::vector<std::int32_t> depth;        // [block] its index in every prompt that holds it
  std::vector<std::int64_t> hash;         // [block] the id in the file (a chunked trace: its state's number)
  std::vector<std::int64_t> tokens;       // [block] tokens it holds (512, or a tail's remainder)
  std::vector<std::int64_t> start;        // [block] its first token's position in every prompt that holds it
  std::vector<std::int32_t> chunk;        // [block] its chunk: one per block in Mooncake, shared by a chunk's states
  std::vector<std::string> chunk_ids;     // [chunk] a chunked trace's chunk ids (empty for Mooncake)
  std::int64_t block_references() const;  // blocks over all requests
  std::size_t blocks() const { return parent.size(); }
  bool chunked() const { return !chunk_ids.empty(); }
  // The block size, or a chunked trace's mean tokens per block (at least 1): what a capacity in
  // blocks is counted in.
  std::int64_t nominal_block_tokens() const;
};

// Reads a Mooncake JSONL trace. Throws naming the file, line and field for: malformed JSON, a
// missing or mistyped field, negative lengths, a hash_ids count other than
// ceil(input_length / block_size), timestamps out of order, and a hash id that follows different
// blocks in different requests (not a prefix hash) or holds different token counts.
RequestTrace read_mooncake_trace(const std::string& path, std::int64_t block_size = kMooncakeBlockTokens);

// Reads a chunked serving trace (docs/chunk-states.md): one JSON object per line with `timestamp`
// (ms, in order), `chunks` ([{"id": string, "tokens": integer > 0}, ...], non-empty), and
// `question_tokens` and `output_length` (integers >= 0). Each distinct chunk given the chunks before
// it is one block. Throws naming the file, line and field, as the Mooncake reader does, and for a
// chunk id with different token counts on different lines or twice in one request.
RequestTrace read_chunked_trace(const std::string& path);

// Either kind, told by the first request's fields: "chunks" (chunked) or "hash_ids" (Mooncake).
RequestTrace read_serve_trace(const std::string& path);

// `times` copies of the trace one after another: each copy's blocks are new (ids shifted past the
// previous copy's) and its arrivals start where the previous copy's ended. For cost-growth benches.
RequestTrace replicate(const RequestTrace& trace, int times);

}  // namespace kvsim::serve
