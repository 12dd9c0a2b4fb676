#pragma once
// Seeds a target writes itself, with kvsim's own writers: with KVSIM_FUZZ_WRITE_SEEDS=DIR set,
// LLVMFuzzerInitialize calls write_seeds(DIR) and the process exits (fuzz/make_corpus.sh).
#include <cstdlib>
#include <functional>
#include <string>

namespace kvsim::fuzz {

inline int seeds_then_exit(const std::function<void(const std::string&)>& write_seeds) {
  const char* dir = std::getenv("KVSIM_FUZZ_WRITE_SEEDS");
  if (!dir) return 0;
  write_seeds(dir);
  std::exit(0);
}

}  // namespace kvsim::fuzz
