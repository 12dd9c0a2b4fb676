// Fuzz target: serving traces (serve/request_trace.h): Mooncake's (JSON lines of timestamp,
// input_length, output_length and hash_ids) read at two block sizes, and the same bytes as a
// chunked trace (timestamp, chunks, question_tokens, output_length), each replayed through the
// prefix cache as `kvsim serve hit-rate` does. Seeds: generated branching traces in the published
// format (make_corpus.sh).
#include <cstdint>

#include "core/error.h"
#include "fuzz/fuzz_input.h"
#include "serve/block_tree.h"
#include "serve/hit_rate.h"
#include "serve/prefix_cache.h"
#include "serve/request_trace.h"

namespace {

void replay(const kvsim::serve::RequestTrace& trace) {
  (void)trace.block_references();
  for (const auto& r : trace.requests)
    for (const std::int32_t b : r.blocks) (void)trace.tokens.at(static_cast<std::size_t>(b));
  (void)kvsim::serve::reuse_ceiling(trace);
  const kvsim::serve::BlockTree tree(trace);
  for (const auto kind : {kvsim::serve::Eviction::Lru, kvsim::serve::Eviction::Lfu, kvsim::serve::Eviction::Slru,
                          kvsim::serve::Eviction::HitsPerToken, kvsim::serve::Eviction::Rppc})
    (void)kvsim::serve::hit_rate(tree, 4, {.kind = kind});
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = kvsim::fuzz::input_file(data, size, "mooncake.jsonl");
  for (const std::int64_t block : {kvsim::serve::kMooncakeBlockTokens, std::int64_t{16}}) {
    try {
      replay(kvsim::serve::read_mooncake_trace(path, block));
    } catch (const kvsim::Error&) {
    }
  }
  try {
    replay(kvsim::serve::read_chunked_trace(path));
  } catch (const kvsim::Error&) {
  }
  return 0;
}
