// Fuzz target: serving cost profiles (JSON, serve/profile.h), then what `kvsim serve simulate`
// does with one: a timed simulation of a small branching request trace under it. Seeds: the
// built-in profiles written by write_profile.
#include <cstdint>
#include <fstream>

#include "core/error.h"
#include "fuzz/fuzz_input.h"
#include "fuzz/seed_writer.h"
#include "serve/block_tree.h"
#include "serve/profile.h"
#include "serve/request_trace.h"
#include "serve/simulator.h"

namespace {

// Six requests over shared prefixes, in the published Mooncake format.
const kvsim::serve::BlockTree& small_tree() {
  static const kvsim::serve::BlockTree tree = [] {
    const std::string path = kvsim::fuzz::output_file("serve_profile_trace.jsonl");
    std::ofstream(path)
        << "{\"timestamp\": 0, \"input_length\": 1500, \"output_length\": 8, \"hash_ids\": [1, 2, 3]}\n"
           "{\"timestamp\": 5, \"input_length\": 1100, \"output_length\": 4, \"hash_ids\": [1, 2, 4]}\n"
           "{\"timestamp\": 9, \"input_length\": 600, \"output_length\": 16, \"hash_ids\": [1, 5]}\n"
           "{\"timestamp\": 9, \"input_length\": 2000, \"output_length\": 2, \"hash_ids\": [1, 2, 3, 6]}\n"
           "{\"timestamp\": 30, \"input_length\": 500, \"output_length\": 1, \"hash_ids\": [7]}\n"
           "{\"timestamp\": 31, \"input_length\": 1100, \"output_length\": 5, \"hash_ids\": [1, 2, 4]}\n";
    return kvsim::serve::BlockTree(kvsim::serve::read_mooncake_trace(path, kvsim::serve::kMooncakeBlockTokens));
  }();
  return tree;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  return kvsim::fuzz::seeds_then_exit([](const std::string& dir) {
    for (const kvsim::serve::ServeProfile& p : kvsim::serve::builtin_profiles())
      kvsim::serve::write_profile(p, dir + "/" + p.name + ".json");
  });
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = kvsim::fuzz::input_file(data, size, "profile.json");
  try {
    kvsim::serve::SimOptions o;
    o.profile = kvsim::serve::load_profile(path);
    o.hbm_gb = 0.5;
    o.dram = {.capacity_gb = 1, .gbps = 20, .latency_ms = 0.01};
    (void)kvsim::serve::simulate(small_tree(), o);
  } catch (const kvsim::Error&) {
  }
  return 0;
}
