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
  // Tokens of its i-th block: full blocks, and the remainder in the last one.
  std::int64_t block_tokens(std::size_t i, std::int64_t block_size) const {
    return i + 1 < blocks.size() ? block_size
                                 : input_tokens - block_size * static_cast<std::int64_t>(blocks.size() - 1);
  }
};

struct RequestTrace {
  std::string path;
  std::int64_t block_size = kMooncakeBlockTokens;
  std::vector<ServeRequest> requests;
  std::vector<std::int32_t> parent;       // [block] the block before it, -1 for a first block
  std::vector<std::int32_t> depth;        // [block] its index in every prompt that holds it
  std::vector<std::int64_t> hash;         // [block] the id in the file
  std::vector<std::int64_t> tokens;       // [block] tokens it holds (512, or a tail's remainder)
  std::int64_t block_references() const;  // blocks over all requests
  std::size_t blocks() const { return parent.size(); }
};

// Reads a Mooncake JSONL trace. Throws naming the file, line and field for: malformed JSON, a
// missing or mistyped field, negative lengths, a hash_ids count other than
// ceil(input_length / block_size), timestamps out of order, and a hash id that follows different
// blocks in different requests (not a prefix hash) or holds different token counts.
RequestTrace read_mooncake_trace(const std::string& path, std::int64_t block_size = kMooncakeBlockTokens);

// `times` copies of the trace one after another: each copy's blocks are new (ids shifted past the
// previous copy's) and its arrivals start where the previous copy's ended. For cost-growth benches.
RequestTrace replicate(const RequestTrace& trace, int times);

}  // namespace kvsim::serve
