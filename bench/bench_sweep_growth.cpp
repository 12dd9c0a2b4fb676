// Sweep cost growth (issue 29): one synthetic trace of N requests of T context tokens (SmolLM2
// geometry, evaluation queries), swept by a fresh child process over its first quarter, half and
// all of it (--shard 0/4, 0/2, 0/1: every 4th, 2nd request), printing per run the wall time, the
// time per (request, config) and the child's peak RSS, then the growth against the quarter run.
// Time should grow with the requests (2x, 4x) and memory not at all: a sweep holds one request's
// layers at a time. Defaults: 100 requests of 8,192 tokens (about 19 GB of trace; --tokens and
// --requests shrink it).
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "sim/sweep.h"
#include "traces/synth_trace.h"
#include "traces/trace_writer.h"

using namespace kvsim;

namespace {

const std::vector<std::string> kPolicies = {"streamingllm", "snapkv", "h2o:queries=recorded",
                                            "tova",         "kivi",   "lowrank"};
const std::vector<double> kBudgets = {0.1, 0.25, 0.5};

// Child mode: one sweep of every shards-th request, then its wall time and peak RSS on stdout.
int sweep_child(const std::string& trace, const std::string& out, int shards) {
  SweepSpec spec;
  spec.traces = {trace};
  spec.policies = kPolicies;
  spec.budgets = kBudgets;
  spec.out_csv = out;
  spec.force = true;
  spec.progress = false;
  spec.shards = shards;
  const auto t0 = bench::Clock::now();
  std::ostringstream quiet;
  run_sweep(spec, quiet);
  std::printf("%.6f ", bench::since(t0));
  bench::print_own_peak_rss();
  return 0;
}

struct Run {
  double seconds = -1;
  long rss = -1;
};

Run child_run(const std::string& trace, const std::string& out, int shards) {
  // popen runs a shell, whose /proc/self/exe is the shell: name this binary by its path.
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string cmd = "'" + self + "' --child '" + trace + "' '" + out + "' " + std::to_string(shards);
  Run r;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    if (std::fscanf(p, "%lf %ld", &r.seconds, &r.rss) != 2) r.seconds = -1;
    if (pclose(p) != 0) r.seconds = -1;
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 5 && std::string(argv[1]) == "--child") return sweep_child(argv[2], argv[3], std::stoi(argv[4]));
  std::string dir = "out/bench";
  int requests = 100, tokens = 8192;
  for (int i = 1; i < argc; i += 2) {
    const std::string a = argv[i];
    if (i + 1 < argc && a == "--dir")
      dir = argv[i + 1];
    else if (i + 1 < argc && a == "--requests")
      requests = std::stoi(argv[i + 1]);
    else if (i + 1 < argc && a == "--tokens")
      tokens = std::stoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: bench_sweep_growth [--dir D] [--requests N (a multiple of 4)] [--tokens T]\n");
      return 2;
    }
  }
  if (requests < 4 || requests % 4 != 0) {
    std::fprintf(stderr, "bench_sweep_growth: --requests %d, expected a multiple of 4\n", requests);
    return 2;
  }
  std::filesystem::create_directories(dir);
  const std::string trace = dir + "/growth.h5", out = dir + "/growth.csv";
  SynthConfig cfg;
  cfg.n_requests = requests;
  cfg.context_tokens = tokens;
  cfg.all_queries = false;  // evaluation queries: the sweep's cost is its reads and keep-sets
  cfg.query_window = 64;
  const auto t0 = bench::Clock::now();
  {
    TraceWriterOptions o;
    o.overwrite = true;
    TraceWriter w(trace, cfg.geometry, synth_capture_info(cfg), o);
    write_synth_trace(cfg, w);
    w.close();
  }
  const double gb = static_cast<double>(std::filesystem::file_size(trace)) / 1e9;
  const std::size_t configs = kPolicies.size() * kBudgets.size();
  std::printf("sweep cost growth: %d requests x %d context tokens (%.1f GB trace, written in %.0f s), %zu configs\n",
              requests, tokens, gb, bench::since(t0), configs);
  std::printf("%9s %10s %22s %14s %14s %12s\n", "requests", "seconds", "s per request-config", "peak RSS MB",
              "time vs 1/4", "RSS vs 1/4");
  Run base;
  for (const int shards : {4, 2, 1}) {
    const Run r = child_run(trace, out, shards);
    const int n = requests / shards;
    if (r.seconds < 0) {
      std::printf("%9d  MEASUREMENT FAILED\n", n);
      return 1;
    }
    if (shards == 4) base = r;
    std::printf("%9d %10.2f %22.4f %14.1f %13.2fx %11.2fx\n", n, r.seconds,
                r.seconds / (n * static_cast<double>(configs)), static_cast<double>(r.rss) / 1e6,
                r.seconds / base.seconds, static_cast<double>(r.rss) / static_cast<double>(base.rss));
  }
  std::printf("expected: time 1x, 2x, 4x (linear in requests); RSS about 1x (one request's working set)\n");
  std::filesystem::remove(trace);
  std::filesystem::remove(out);
  return 0;
}
