#pragma once
// The small synthetic trace that the sweep-resume and policy-spec targets sweep. Its path does not
// change between processes, so a sweep's configuration line (which names the trace) is the same in
// every run and in the seeds.
#include <cstdio>
#include <string>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz/fuzz_input.h"
#include "traces/synth_trace.h"
#include "traces/trace_writer.h"

namespace kvsim::fuzz {

// Written once; through a temporary name and a rename, since fork workers may race.
inline const std::string& small_trace() {
  static const std::string path = [] {
    const std::string p = scratch_dir() + "/kvsim-fuzz-small-trace.h5";
    struct stat st {};
    if (stat(p.c_str(), &st) == 0) return p;
    SynthConfig cfg;
    cfg.geometry.name = "tiny";
    cfg.geometry.n_layers = 2;
    cfg.geometry.n_q_heads = 2;
    cfg.geometry.n_kv_heads = 1;
    cfg.geometry.head_dim = cfg.geometry.rope.head_dim = cfg.geometry.rope.rope_dim = 16;
    cfg.geometry.vocab = 100;
    cfg.n_requests = 3;
    cfg.system_tokens = 2;
    cfg.context_tokens = 24;
    cfg.question_tokens = 3;
    cfg.generated_tokens = 2;
    cfg.needle_tokens = 2;
    cfg.ref_topk = 4;
    cfg.repeat_pass = true;  // so kvzip runs too
    const std::string tmp = p + "." + std::to_string(getpid());
    TraceWriterOptions opts;
    opts.overwrite = true;
    {
      TraceWriter w(tmp, cfg.geometry, synth_capture_info(cfg), opts);
      write_synth_trace(cfg, w);
      w.close();
    }
    std::rename(tmp.c_str(), p.c_str());
    return p;
  }();
  return path;
}

}  // namespace kvsim::fuzz
