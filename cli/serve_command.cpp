// `kvsim serve`: the serving simulator (docs/serving.md). `hit-rate`: prefix-cache hit rates of a
// request trace over capacities and eviction policies, without timing; `profile`: cost profiles;
// `simulate` (serve_simulate_command.cpp): the timed simulation.
#include <boost/program_options.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/dispatch.h"
#include "cli/options.h"
#include "cli/serve_commands.h"
#include "cli/serve_grid.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/sha256.h"
#include "model/engine.h"
#include "model/gguf.h"
#include "serve/chunk_workload.h"
#include "serve/hit_rate.h"
#include "serve/profile.h"
#include "results/serve_file.h"

namespace po = boost::program_options;

namespace kvsim::cli {

std::vector<std::int64_t> parse_counts(const std::string& s, const std::string& flag, const std::string& what) {
  std::vector<std::int64_t> out;
  for (const std::string& v : split(s, ',')) {
    std::size_t used = 0;
    long long x = 0;
    try {
      x = std::stoll(v, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != v.size() || x < 1) throw Error(flag + ": '" + v + "' is not a " + what + " >= 1");
    out.push_back(x);
  }
  if (out.empty()) throw Error(flag + ": no values given");
  return out;
}

void refuse_overwrite(const std::vector<std::string>& files, bool force) {
  for (const std::string& f : files) refuse_overwrite(f, force);
}

namespace {

nlohmann::json hit_rate_row(const serve::HitRateResult& r) {
  return nlohmann::json{{"eviction", r.eviction},
                        {"capacity_blocks", r.capacity},
                        {"requests", r.requests},
                        {"block_refs", r.block_refs},
                        {"hit_blocks", r.hit_blocks},
                        {"block_hit_rate", r.block_hit_rate()},
                        {"tokens", r.tokens},
                        {"hit_tokens", r.hit_tokens},
                        {"token_hit_rate", r.token_hit_rate()},
                        {"evictions", r.evictions},
                        {"seconds", r.seconds}};  // printed only: not in the outputs, which stay reproducible
}

int hit_rate_cmd(const Args& args) {
  std::string trace_path, capacities = "1000,2000,5000,10000,20000", evictions = "lru", out, json;
  double slru_protected = 0.8;
  po::options_description desc(
      "kvsim serve hit-rate: prefix-cache hit rates of a request trace (Mooncake JSONL: timestamp, input_length,\n"
      "output_length, hash_ids of 512-token blocks; or chunked: timestamp, chunks of ids and tokens, question_tokens,\n"
      "output_length, each chunk after a path of chunks a block: docs/chunk-states.md) per capacity and eviction\n"
      "policy, without timing. Requests in file order; a request's hit is its longest cached run of blocks from the\n"
      "first; then all its blocks are touched or inserted (docs/serving.md)");
  desc.add_options()("help,h", "show this help")("trace", po::value(&trace_path)->required(), "request trace (JSONL)")(
      "capacity,c", po::value(&capacities)->default_value(capacities), "capacities in blocks, comma-separated")(
      "eviction,e", po::value(&evictions)->default_value(evictions),
      "eviction policies, comma-separated: lru, lfu, slru, hits_per_token, rppc")(
      "slru-protected", po::value(&slru_protected)->default_value(slru_protected),
      "SLRU: protected share of the capacity")("out,o", po::value(&out),
                                               "result CSV (one row per policy and capacity)")(
      "json", po::value(&json), "summary JSON (the rows, the trace and its reuse ceiling)")(
      "resume", "continue a run that was stopped: its finished rows are kept in OUT.progress")(
      "force", "replace existing outputs");
  po::positional_options_description pos;
  pos.add("trace", 1);
  po::variables_map vm;
  add_output_flags(desc);
  if (!parse_options(args, desc, pos, vm, "kvsim serve hit-rate TRACE.jsonl [-c 1000,5000] [-e lru,rppc] [-o out.csv]"))
    return 0;
  const std::vector<std::int64_t> caps = parse_counts(capacities, "--capacity", "block count");
  if (!(slru_protected > 0 && slru_protected <= 1))
    throw Error("--slru-protected: got " + std::to_string(slru_protected) + "; expected a share in (0, 1]");
  std::vector<serve::Eviction> kinds;
  for (const std::string& e : split(evictions, ',')) kinds.push_back(serve::parse_eviction(e));
  ServeGrid grid;
  grid.points = kinds.size() * caps.size();
  grid.progress = grid_progress_path(out, json);
  grid.resume = vm.count("resume") > 0;
  grid.force = vm.count("force") > 0;
  grid.config = {{"command", "serve hit-rate"}, {"trace", trace_path},    {"trace_sha256", sha256_file_hex(trace_path)},
                 {"capacities", caps},          {"evictions", evictions}, {"slru_protected", slru_protected}};
  grid.row_template = hit_rate_row(serve::HitRateResult{});
  if (grid_finished(grid, {out, json})) return 0;
  refuse_grid_overwrite(grid, {out, json});
  const serve::RequestTrace trace = serve::read_serve_trace(trace_path);
  const serve::BlockTree tree(trace);
  const serve::ReuseCeiling ceiling = serve::reuse_ceiling(trace);
  const bool quiet = grid_worker_rank();
  if (!quiet)
    std::printf(
        "%s: %zu requests, %lld block references, %lld distinct blocks; reuse ceiling %.4f of blocks, %.4f of "
        "tokens\n",
        trace_path.c_str(), trace.requests.size(), static_cast<long long>(trace.block_references()),
        static_cast<long long>(ceiling.distinct_blocks), ceiling.blocks, ceiling.tokens);
  if (!quiet)
    std::printf("%-15s %10s %10s %10s %10s %12s\n", "eviction", "capacity", "block hit", "token hit", "evictions",
                "Mrefs/s");
  grid.run = [&](std::size_t p) {
    serve::EvictionOptions o;
    o.kind = kinds[p / caps.size()];
    o.slru_protected = slru_protected;
    return hit_rate_row(serve::hit_rate(tree, caps[p % caps.size()], o));
  };
  grid.report = [&](std::size_t, const nlohmann::json& row) {
    if (quiet) return;
    auto num = [&](const char* key) { return row.at(key).is_number() ? row.at(key).get<double>() : std::nan(""); };
    std::printf("%-15s %10.0f %10.4f %10.4f %10.0f %12.1f\n", row.at("eviction").get<std::string>().c_str(),
                num("capacity_blocks"), num("block_hit_rate"), num("token_hit_rate"), num("evictions"),
                num("block_refs") / std::max(num("seconds"), 1e-9) / 1e6);
  };
  std::vector<nlohmann::json> rows = run_grid(grid);
  nlohmann::json summary = {{"trace", trace_path},
                            {"requests", trace.requests.size()},
                            {"block_refs", trace.block_references()},
                            {"distinct_blocks", ceiling.distinct_blocks},
                            {"reuse_ceiling_blocks", ceiling.blocks},
                            {"reuse_ceiling_tokens", ceiling.tokens},
                            {"results", nlohmann::json::array()}};
  for (nlohmann::json& row : rows) {
    row.erase("seconds");
    summary["results"].push_back(std::move(row));
  }
  // One CSV row per result, the trace's ceiling repeated on each.
  if (!out.empty()) write_file_atomically(out, results::serve_csv_text(results::ServeKind::HitRate, summary));
  if (!json.empty()) write_file_atomically(json, results::serve_json_text(summary));
  finish_grid(grid);
  return 0;
}

// Milliseconds of the best of `reps` runs of f.
template <typename F>
double best_ms(int reps, F f) {
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

int profile_cmd(const Args& args) {
  std::string model, out, name, lengths = "64,128,256,512,1024", contexts = "128,512,1024";
  int steps = 8;
  po::options_description desc(
      "kvsim serve profile: fit a serving cost profile to kvsim's own engine on this machine. Prefill of l tokens\n"
      "is timed at each --lengths and fitted to a + b*l + c*l^2; a decode step after each --contexts to\n"
      "a + b*ctx (the engine runs one sequence at a time, so the per-sequence batch term is not measured and stays\n"
      "0). Coefficients are fitted non-negative. Or pass --show NAME to print a built-in profile");
  desc.add_options()("help,h", "show this help")("model,m", po::value(&model), "GGUF model")(
      "out,o", po::value(&out), "profile JSON to write")("name", po::value(&name), "profile name (default: model-cpu)")(
      "lengths", po::value(&lengths)->default_value(lengths), "prefill lengths in tokens")(
      "contexts", po::value(&contexts)->default_value(contexts), "decode context lengths in tokens")(
      "steps", po::value(&steps)->default_value(steps), "decode steps timed per context")(
      "show", po::value<std::string>(), "print a profile (built-in name or file) and exit")("force", "replace --out");
  po::variables_map vm;
  add_output_flags(desc);
  if (!parse_options(args, desc, po::positional_options_description(), vm,
                     "kvsim serve profile -m MODEL.gguf -o profile.json | --show llama2-7b-h100"))
    return 0;
  if (vm.count("show")) {
    const serve::ServeProfile p = serve::load_profile(vm["show"].as<std::string>());
    std::printf(
        "%s (%s)\nprefill: %.4g + %.4g*l + %.4g*l^2 ms\ndecode step: %.4g + %.4g*sum(ctx) + %.4g*B ms\n"
        "KV: %.0f bytes per token\n",
        p.name.c_str(), p.source.c_str(), p.prefill.a_ms, p.prefill.b_ms_per_token, p.prefill.c_ms_per_token2,
        p.decode.a_ms, p.decode.b_ms_per_ctx_token, p.decode.c_ms_per_seq, p.kv_bytes_per_token);
    return 0;
  }
  if (model.empty() || out.empty()) throw Error("--model and --out are required (or --show NAME)");
  refuse_overwrite(out, vm.count("force") > 0);
  if (steps < 1) throw Error("--steps: got " + std::to_string(steps) + "; expected >= 1");
  const std::vector<std::int64_t> ls = parse_counts(lengths, "--lengths", "token count"),
                                  cs = parse_counts(contexts, "--contexts", "token count");
  const GgufFile gguf(model);
  const std::unique_ptr<Engine> eng = make_engine(gguf, EngineOptions{});
  const ModelConfig& c = eng->config();
  auto prompt = [&](std::int64_t n) {
    std::vector<std::int32_t> t(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i)
      t[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(1 + (i * 7919) % (c.vocab - 1));
    return t;
  };
  std::vector<serve::CostSample> pre, dec;
  for (const std::int64_t l : ls) {
    const auto t = prompt(l);
    const double ms = best_ms(2, [&] {
      eng->reset();
      eng->prefill(t);
    });
    pre.push_back({static_cast<double>(l), static_cast<double>(l) * static_cast<double>(l), 1, ms});
    std::printf("prefill %6lld tokens: %9.2f ms\n", static_cast<long long>(l), ms);
  }
  for (const std::int64_t ctx : cs) {
    eng->reset();
    eng->prefill(prompt(ctx));
    const double ms = best_ms(1,
                              [&] {
                                for (int s = 0; s < steps; ++s) eng->step(static_cast<std::int32_t>(1 + s));
                              }) /
                      steps;
    dec.push_back({static_cast<double>(ctx) + (steps + 1) / 2.0, 0, 1, ms});  // the mean context of the steps
    std::printf("decode after %6lld tokens: %9.3f ms per step\n", static_cast<long long>(ctx), ms);
  }
  serve::ServeProfile p;
  p.name = name.empty() ? std::filesystem::path(model).stem().string() + "-cpu" : name;
  p.source = "fitted: kvsim serve profile on " + std::filesystem::path(model).filename().string() +
             ", CPU engine, one sequence (no batch term)";
  const std::vector<double> pw = serve::fit_nonnegative(pre, false), dw = serve::fit_nonnegative(dec, true);
  p.prefill = {p.name, pw[0], pw[1], pw[2]};
  p.decode = {dw[0] + dw[2], dw[1], 0.0};  // with one sequence the batch term is part of the intercept
  p.kv_bytes_per_token = 2.0 * c.n_layers * c.n_kv_heads * c.head_dim * 2;
  serve::write_profile(p, out);
  std::printf("%s: prefill %.4g + %.4g*l + %.4g*l^2 ms; decode step %.4g + %.4g*ctx ms; KV %.0f bytes per token\n",
              out.c_str(), p.prefill.a_ms, p.prefill.b_ms_per_token, p.prefill.c_ms_per_token2, p.decode.a_ms,
              p.decode.b_ms_per_ctx_token, p.kv_bytes_per_token);
  return 0;
}

int workload_cmd(const Args& args) {
  serve::ChunkWorkloadSpec s;
  std::string kind = "rag", out;
  po::options_description desc(
      "kvsim serve workload: write a chunked serving trace (docs/chunk-states.md): a system chunk, reusable chunks\n"
      "drawn by Zipf popularity, a question never cached; Poisson arrivals. rag: distinct documents per request in\n"
      "the retriever's order; agent: sessions of turns, each turn repeating the session's chunks and adding a tool\n"
      "output");
  desc.add_options()("help,h", "show this help")("out,o", po::value(&out)->required(), "output JSONL")(
      "workload", po::value(&kind)->default_value(kind), "rag | agent")(
      "requests", po::value(&s.requests)->default_value(s.requests), "requests")(
      "pool", po::value(&s.pool)->default_value(s.pool), "distinct documents or tool outputs")(
      "per-request", po::value(&s.per_request)->default_value(s.per_request),
      "rag: documents per request; agent: turns per session")("zipf", po::value(&s.zipf)->default_value(s.zipf),
                                                              "popularity: weight 1 / rank^zipf")(
      "chunk-tokens", po::value(&s.chunk_tokens)->default_value(s.chunk_tokens),
      "a pooled chunk's mean tokens (each drawn in [1/2, 3/2] of it)")(
      "system-tokens", po::value(&s.system_tokens)->default_value(s.system_tokens), "the shared system chunk")(
      "question-tokens", po::value(&s.question_tokens)->default_value(s.question_tokens), "per request, never cached")(
      "output-tokens", po::value(&s.output_tokens)->default_value(s.output_tokens), "per request")(
      "rate", po::value(&s.rate)->default_value(s.rate), "arrivals per second (Poisson)")(
      "seed", po::value(&s.seed)->default_value(s.seed), "random seed")("force", "replace an existing file");
  po::variables_map vm;
  add_output_flags(desc);
  if (!parse_options(args, desc, po::positional_options_description(), vm,
                     "kvsim serve workload -o trace.jsonl [options]"))
    return 0;
  s.kind = serve::parse_chunk_workload(kind);
  if (!vm.count("force") && std::filesystem::exists(out))
    throw Error(out + ": file exists; refusing to overwrite it (pass --force to replace)");
  write_file_atomically(out, serve::chunk_workload_jsonl(s));
  std::printf("%s: %d %s requests over a pool of %d chunks (zipf %g, %g requests/s)\n", out.c_str(), s.requests,
              kind.c_str(), s.pool, s.zipf, s.rate);
  return 0;
}

}  // namespace

int serve_command(const Args& args) {
  static const Subcommand subs[] = {
      {"hit-rate", "prefix-cache hit rates per capacity and eviction policy (no timing)", hit_rate_cmd},
      {"simulate", "timed simulation: batching, memory tiers, TTFT and throughput, with KV compression",
       serve_simulate},
      {"profile", "fit a serving cost profile to the engine on this machine, or show a built-in one", profile_cmd},
      {"workload", "write a chunked serving trace (rag or agent, Zipf popularity)", workload_cmd}};
  return dispatch("kvsim serve", subs, args);
}

}  // namespace kvsim::cli
