#pragma once
// Small traces and file surgery shared by the trace tests.
#include <cstdlib>
#include <filesystem>
#include <string>
#include <unistd.h>

#include "traces/synth_trace.h"
#include "traces/trace_writer.h"

namespace kvsim::test {

// A fresh scratch directory per test binary run, removed at exit.
inline std::filesystem::path scratch_dir() {
  static const std::filesystem::path dir = [] {
    auto base = std::filesystem::temp_directory_path() / ("kvsim-test-" + std::to_string(::getpid()));
    std::filesystem::create_directories(base);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(std::filesystem::temp_directory_path() / ("kvsim-test-" + std::to_string(::getpid())),
                                  ec);
    });
    return base;
  }();
  return dir;
}

inline std::string scratch_file(const std::string& name) { return (scratch_dir() / name).string(); }

// Small geometry: fast to write, still GQA (group of 2) and several layers.
inline SynthConfig small_synth_config(std::uint64_t seed = 7) {
  SynthConfig cfg;
  cfg.geometry.name = "tiny";
  cfg.geometry.n_layers = 4;
  cfg.geometry.n_q_heads = 4;
  cfg.geometry.n_kv_heads = 2;
  cfg.geometry.head_dim = 16;
  cfg.geometry.rope.rope_dim = cfg.geometry.rope.head_dim = 16;
  cfg.geometry.vocab = 1000;
  cfg.seed = seed;
  cfg.n_requests = 3;
  cfg.system_tokens = 4;
  cfg.context_tokens = 48;
  cfg.question_tokens = 6;
  cfg.generated_tokens = 5;
  cfg.needle_tokens = 4;
  cfg.repeat_pass = true;  // so kvzip runs on test traces
  cfg.ref_topk = 4;
  return cfg;
}

inline std::string write_small_trace(const std::string& name, const SynthConfig& cfg = small_synth_config(),
                                     int deflate = 0) {
  const std::string path = scratch_file(name);
  TraceWriterOptions opts;
  opts.overwrite = true;
  opts.deflate_level = deflate;
  TraceWriter writer(path, cfg.geometry, synth_capture_info(cfg), opts);
  write_synth_trace(cfg, writer);
  writer.close();
  return path;
}

}  // namespace kvsim::test
