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
#include "prompts/prompt.h"
#include "model/gguf.h"
#include "model/llama_model.h"
#include "capture/task_gen.h"
#include "model/tokenizer.h"
#include "traces/trace_reader.h"
#include "bench_util.h"
#include "core/heap_reuse.h"

using namespace kvsim;
using namespace kvsim::bench;

namespace {

// Multiply-adds per token of the weight matrices (the GEMM work of a forward pass).
double weight_macs(const ModelConfig& c) {
  const double q = static_cast<double>(c.n_q_heads) * c.head_dim, kv = static_cast<double>(c.n_kv_heads) * c.head_dim;
  return c.n_layers * (c.n_embd * (q + 2 * kv) + q * c.n_embd + 3.0 * c.n_embd * c.n_ff);
}

std::vector<CaptureRequest> requests(int tokens, int count) {
  NeedleSpec spec;
  spec.count = count;
  spec.approx_tokens = tokens;
  return make_needle_tasks(spec);
}

int rss_child(const std::string& model, const std::string& dir, const std::string& weights, int tokens) {
  CaptureOptions o;
  o.model_path = model;
  o.out_path = dir + "/bench_rss.h5";
  o.overwrite = true;
  o.max_new = 16;
  o.all_queries = true;
  o.weights = parse_weight_format(weights);
  run_capture(requests(tokens, 1), o);  // the parent reads the token count from the trace
  bench::print_own_peak_rss();
  return 0;
}

}  // namespace

// Decode speed at a given context, as llama-bench measures it (-n 128 after an empty context,
// -pg 1024,128 after a 1024-token prompt): 128 greedy steps, quantized weights, best of 2.
void decode_at_contexts(const GgufFile& gguf, const std::vector<std::int32_t>& ids) {
  LlamaModel m(gguf, WeightFormat::Quantized);
  for (const std::int64_t context : {std::int64_t{128}, std::int64_t{1024}}) {
    std::vector<std::int32_t> prompt(
        ids.begin(), ids.begin() + std::min<std::ptrdiff_t>(static_cast<std::ptrdiff_t>(ids.size()), context));
    while (static_cast<std::int64_t>(prompt.size()) < context) prompt.push_back(ids[prompt.size() % ids.size()]);
    double best = 1e30, best_prefill = 1e30;
    for (int rep = 0; rep < 2; ++rep) {
      m.reset();
      const auto tp = Clock::now();
      std::vector<float> lg = m.prefill(prompt);
      best_prefill = std::min(best_prefill, since(tp));
      const auto t0 = Clock::now();
      for (int i = 0; i < 128; ++i)
        lg = m.step(static_cast<std::int32_t>(std::max_element(lg.begin(), lg.end()) - lg.begin()));
      best = std::min(best, since(t0));
    }
    std::printf(
        "prefill of %4lld tokens: %6.1f tokens/s; decode after %4lld tokens: %6.1f tokens/s (128 steps, quantized "
        "weights; set beside llama-bench -p %lld and %s)\n",
        static_cast<long long>(context), static_cast<double>(context) / best_prefill, static_cast<long long>(context),
        128 / best, static_cast<long long>(context), context == 128 ? "-n 128" : "-pg 1024,128");
  }
}

int main(int argc, char** argv) {
  keep_freed_memory_for_reuse();  // as the kvsim command does
  if (argc == 6 && std::string(argv[1]) == "--rss-child")
    return rss_child(argv[2], argv[3], argv[4], std::atoi(argv[5]));
  std::string model =
      std::string(getenv("HOME") ? getenv("HOME") : ".") + "/.cache/kvsim/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  std::string dir = "out/bench";
  bool decode_only = false;
  for (int i = 1; i < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--decode-only") {
      decode_only = true;
      --i;  // a flag without a value
    } else if (i + 1 < argc && a == "--model")
      model = argv[i + 1];
    else if (i + 1 < argc && a == "--dir")
      dir = argv[i + 1];
    else {  // --help, an unknown option or one without its value
      std::fprintf(stderr, "usage: bench_capture [--model M.gguf] [--dir D] [--decode-only]\n");
      return 2;
    }
  }
  std::filesystem::create_directories(dir);
  const GgufFile gguf(model);
  const Tokenizer tok(gguf);
  const ModelConfig c = model_config(gguf);

  // Prefill: a ~1K-token prompt in 256-token chunks; decode: 64 greedy steps; once with the
  // weights dequantized to f32 at load, once kept in their GGUF blocks.
  const auto req = requests(1000, 1).front();
  std::vector<std::int32_t> ids =
      tok.encode(tok.chat(default_system_prompt(gguf), req.context + "\n\n" + req.question));
  if (decode_only) {
    std::printf("%s CPU engine, decode only\n", c.name.c_str());
    decode_at_contexts(gguf, ids);
    return 0;
  }
  const double gemm = eigen_gemm_gflops();
  const double n = static_cast<double>(ids.size());
  std::printf("%s CPU engine, %zu-token prompt; Eigen GEMM 1024^3 %.1f GFLOP/s\n", c.name.c_str(), ids.size(), gemm);
  for (const WeightFormat fmt : {WeightFormat::F32, WeightFormat::Quantized}) {
    LlamaModel m(gguf, fmt);
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
    const double prefill_gflops = 2.0 * weight_macs(c) * n / t_prefill / 1e9;
    std::printf(
        "weights %-5s prefill %7.1f tokens/s | %6.1f GFLOP/s (weight GEMMs) | ratio to GEMM %.2f (target >= 0.5) %s | "
        "decode %6.1f tokens/s (%d steps)\n",
        weight_format_name(fmt), n / t_prefill, prefill_gflops, prefill_gflops / gemm,
        prefill_gflops / gemm >= 0.5 ? "OK" : "BELOW TARGET", steps / t_decode, steps);
  }

  decode_at_contexts(gguf, ids);

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
      std::vector<std::int32_t> p = tok.encode(tok.chat(default_system_prompt(gguf), r.context + "\n\n" + r.question));
      std::vector<float> lg = plain.prefill(p);
      for (int i = 0; i < o.max_new; ++i) {
        const auto next = static_cast<std::int32_t>(std::max_element(lg.begin(), lg.end()) - lg.begin());
        if (tok.is_eog(next)) break;
        lg = plain.step(next);
      }
    }
  }
  const double t_plain = since(tg);
  // The capture run also loads the model once (about as long as the plain run's load above).
  std::printf("capture overhead %8.2fx (capture %.2f s vs plain generation %.2f s, 3 requests; target <= 1.3x) %s\n",
              t_capture / t_plain, t_capture, t_plain, t_capture / t_plain <= 1.3 ? "OK" : "ABOVE TARGET");
  std::filesystem::remove(o.out_path);

  // Peak RSS of capturing a 4K-token request against a 256-token one, all queries kept. Without
  // whole-request buffering the difference is the KV cache's growth, three layers of f16 trace
  // buffers in flight (one being written, one queued, one being converted), the prefill's
  // attention scores (chunk x tokens per thread) and 16 MB of allocator slack; buffering the
  // request would add every layer's K/V/Q on top (printed for scale).
  const double kv_row = static_cast<double>(c.n_kv_heads) * c.head_dim,
               q_row = static_cast<double>(c.n_q_heads) * c.head_dim;
  auto measure = [&](WeightFormat fmt, int tokens, double& T) {
    const long rss =
        bench::child_peak_rss({"--rss-child", model, dir, weight_format_name(fmt), std::to_string(tokens)});
    const std::string trace = dir + "/bench_rss.h5";
    {
      const TraceReader reader(trace);
      T = static_cast<double>(reader.header(reader.request_ids().front()).tokens.size());
    }
    std::filesystem::remove(trace);
    return static_cast<double>(rss);
  };
  for (const WeightFormat fmt : {WeightFormat::Quantized, WeightFormat::F32}) {
    double t_small = 0, t_big = 0;
    const double small = measure(fmt, 256, t_small), big = measure(fmt, 4096, t_big);
    const double kv = 2.0 * c.n_layers * (t_big - t_small) * kv_row * 4;
    const double layer_buffers = 3.0 * t_big * (2 * kv_row + q_row) * 2;
    const double scores = 2.0 * o.prefill_chunk * t_big * 4;
    const double allowed = kv + layer_buffers + scores + 16e6;
    const double whole_request = c.n_layers * t_big * (2 * kv_row + q_row) * 2;
    std::printf(
        "peak RSS, weights %-5s: %.0f tokens %7.1f MB, %.0f tokens %7.1f MB | growth %6.1f MB, allowed %6.1f MB "
        "(KV %.0f + 3 trace layers %.0f + scores %.0f + 16) %s | whole-request buffers would add %.0f MB\n",
        weight_format_name(fmt), t_small, small / 1e6, t_big, big / 1e6, (big - small) / 1e6, allowed / 1e6, kv / 1e6,
        layer_buffers / 1e6, scores / 1e6, small > 0 && big > 0 && big - small <= allowed ? "OK" : "OVER",
        whole_request / 1e6);
  }
  return 0;
}
