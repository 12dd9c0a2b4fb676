#pragma once
// Shared by the fuzz targets. The readers take paths, so each input is written to a scratch file
// first (in /dev/shm where there is one: no disk traffic per execution).
//
// The rule every target holds the code to: hostile input ends in a kvsim::Error, whose message
// names the file and field. Any other exception escapes LLVMFuzzerTestOneInput and libFuzzer
// reports it as a crash, like a memory error or undefined behaviour caught by the sanitizers.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <unistd.h>
#include <vector>

namespace kvsim::fuzz {

// The scratch files this process made, removed at its exit: in -fork runs every job is a new
// process, and /dev/shm is memory.
inline std::vector<std::string>& scratch_files() {
  static std::vector<std::string> files;
  return files;
}
inline void remove_scratch_files() {
  for (const std::string& f : scratch_files()) std::remove(f.c_str());
}
inline void track_scratch_file(const std::string& path) {
  // The list first, the exit handler second: exit runs them in reverse, so the list still exists
  // when the handler reads it.
  auto& files = scratch_files();
  static const bool registered = (std::atexit(remove_scratch_files), true);
  (void)registered;
  if (std::find(files.begin(), files.end(), path) == files.end()) files.push_back(path);
}

inline std::string scratch_dir() {
  if (access("/dev/shm", W_OK) == 0) return "/dev/shm";
  const char* t = std::getenv("TMPDIR");
  return t && *t ? t : "/tmp";
}

// `name` made unique to this process, holding exactly `data`.
inline std::string input_file(const std::uint8_t* data, std::size_t size, const std::string& name) {
  const std::string path = scratch_dir() + "/kvsim-fuzz-" + std::to_string(getpid()) + "-" + name;
  track_scratch_file(path);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return path;
}

// A scratch path for outputs the target writes (results files), removed first.
inline std::string output_file(const std::string& name) {
  const std::string path = scratch_dir() + "/kvsim-fuzz-" + std::to_string(getpid()) + "-" + name;
  track_scratch_file(path);
  std::remove(path.c_str());
  return path;
}

}  // namespace kvsim::fuzz
