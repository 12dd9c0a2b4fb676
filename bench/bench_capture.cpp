// Capture benchmark (issue 4): on SmolLM2-135M, prefill and decode tokens/s of the CPU engine
// with its achieved GFLOP/s next to an Eigen GEMM's measured in the same run (target prefill >=
// 0.5 of GEMM), capture time against plain generation of the same requests (target <= 1.3x), and
// the peak RSS of capturing a 4K-token request (in a child process).

#include <Eigen/Dense>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include "capture/capture_driver.h"
#include "capture/gguf.h"
#include "capture/llama_model.h"
#include "capture/task_gen.h"
#include "capture/tokenizer.h"
#include "bench_util.h"

using namespace kvsim;
using namespace kvsim::bench;

namespace {


// Multiply-adds per token of the weight matrices (the GEMM work of a forward pass).
double weight_macs(const LlamaConfig& c) {
  const double q = static_cast<double>(c.n_head) * c.head_dim, kv = static_cast<double>(c.n_head_kv) * c.head_dim;
  return c.n_layers * (c.n_embd * (q + 2 * kv) + q * c.n_embd + 3.0 * c.n_embd * c.n_ff);
}

std::vector<CaptureRequest> requests(int tokens, int count) {
  NeedleSpec spec;
  spec.count = count;
  spec.approx_tokens = tokens;
  return make_needle_tasks(spec);
}


int rss_child(const std::string& model, const std::string& dir) {
  CaptureOptions o;
  o.model_path = model;
  o.out_path = dir + "/bench_rss.h5";
  o.overwrite = true;
  o.max_new = 16;
  run_capture(requests(4096, 1), o);
  std::filesystem::remove(o.out_path);
  bench::print_own_peak_rss();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--rss-child") return rss_child(argv[2], argv[3]);
  std::string model = std::string(getenv("HOME") ? getenv("HOME") : ".") + "/.cache/kvsim/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  std::string dir = "out/bench";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--model") model = argv[i + 1];
    else if (a == "--dir") dir = argv[i + 1];
    else {
      std::fprintf(stderr, "usage: bench_capture [--model M.gguf] [--dir D]\n");
      return 2;
    }
  }
  std::filesystem::create_directories(dir);
  const GgufFile gguf(model);
  const Tokenizer tok(gguf);
  LlamaModel m(gguf);
  const LlamaConfig& c = m.config();

  // Prefill: a ~1K-token prompt in 256-token chunks; decode: 64 greedy steps.
  const auto req = requests(1000, 1).front();
  std::vector<std::int32_t> ids = tok.encode(Tokenizer::chatml("", req.context + "\n\n" + req.question));
  double t_prefill = 1e30;
  std::vector<float> logits;
  for (int rep = 0; rep < 2; ++rep) {
    m.reset();
    const auto t0 = Clock::now();
    logits = m.prefill(ids);
    t_prefill = std::min(t_prefill, since(t0));
  }
  const auto t0 = Clock::now();
  const int steps = 64;
  for (int i = 0; i < steps; ++i) {
    const auto next = static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    logits = m.step(next);
  }
  const double t_decode = since(t0);
  const double gemm = eigen_gemm_gflops();
  const double n = static_cast<double>(ids.size());
  const double prefill_gflops = 2.0 * weight_macs(c) * n / t_prefill / 1e9;
  std::printf("SmolLM2-135M CPU engine (f32 weights), %zu-token prompt\n", ids.size());
  std::printf("prefill          %8.1f tokens/s | %6.1f GFLOP/s (weight GEMMs) | Eigen GEMM 1024^3 %6.1f GFLOP/s | "
              "ratio %.2f (target >= 0.5) %s\n",
              n / t_prefill, prefill_gflops, gemm, prefill_gflops / gemm, prefill_gflops / gemm >= 0.5 ? "OK" : "BELOW TARGET");
  std::printf("decode           %8.1f tokens/s (%d steps after the prompt)\n", steps / t_decode, steps);

  // Capture against plain generation of the same requests (same prompts, same greedy length).
  const auto reqs = requests(1000, 3);
  CaptureOptions o;
  o.model_path = model;
  o.out_path = dir + "/bench_capture.h5";
  o.overwrite = true;
  o.max_new = 32;
  const auto tc = Clock::now();
  run_capture(reqs, o);
  const double t_capture = since(tc);
  const auto tg = Clock::now();
  {
    LlamaModel plain(gguf);
    for (const auto& r : reqs) {
      plain.reset();
      std::vector<std::int32_t> p = tok.encode(Tokenizer::chatml("", r.context + "\n\n" + r.question));
      std::vector<float> lg = plain.prefill(p);
      for (int i = 0; i < o.max_new; ++i) {
        const auto next = static_cast<std::int32_t>(std::max_element(lg.begin(), lg.end()) - lg.begin());
        if (next == tok.eos()) break;
        lg = plain.step(next);
      }
    }
  }
  const double t_plain = since(tg);
  // The capture run also loads the model once (about as long as the plain run's load above).
  std::printf("capture overhead %8.2fx (capture %.2f s vs plain generation %.2f s, 3 requests; target <= 1.3x) %s\n",
              t_capture / t_plain, t_capture, t_plain, t_capture / t_plain <= 1.3 ? "OK" : "ABOVE TARGET");
  std::filesystem::remove(o.out_path);

  const long rss = bench::child_peak_rss({"--rss-child", model, dir});
  std::printf("peak RSS, capture of a 4K-token request: %.1f MB (f32 weights %.1f MB)\n", static_cast<double>(rss) / 1e6,
              (weight_macs(c) + static_cast<double>(c.vocab) * c.n_embd) * 4 / 1e6);
  return 0;
}
