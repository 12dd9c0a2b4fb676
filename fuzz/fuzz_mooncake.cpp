// Fuzz target: Mooncake serving traces (JSON lines of timestamp, input_length, output_length and
// hash_ids; serve/request_trace.h), read at two block sizes, then replayed through the prefix
// cache as `kvsim serve hit-rate` does. Seeds: generated branching traces in the published format
// (make_corpus.sh).
#include <cstdint>

#include "core/error.h"
#include "fuzz/fuzz_input.h"
#include "serve/block_tree.h"
#include "serve/hit_rate.h"
#include "serve/prefix_cache.h"
#include "serve/request_trace.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = kvsim::fuzz::input_file(data, size, "mooncake.jsonl");
  for (const std::int64_t block : {kvsim::serve::kMooncakeBlockTokens, std::int64_t{16}}) {
    try {
      const auto trace = kvsim::serve::read_mooncake_trace(path, block);
      (void)trace.block_references();
      for (const auto& r : trace.requests)
        for (std::size_t i = 0; i < r.blocks.size(); ++i) (void)r.block_tokens(i, block);
      (void)kvsim::serve::reuse_ceiling(trace);
      const kvsim::serve::BlockTree tree(trace);
      for (const auto kind : {kvsim::serve::Eviction::Lru, kvsim::serve::Eviction::Lfu, kvsim::serve::Eviction::Slru,
                              kvsim::serve::Eviction::HitsPerToken, kvsim::serve::Eviction::Rppc})
        (void)kvsim::serve::hit_rate(tree, 4, {.kind = kind});
    } catch (const kvsim::Error&) {
    }
  }
  return 0;
}
