// `kvsim trace {info,check,synth,dump,keep-sets,fit-basis}`: the user-facing side of traces/.
#include <boost/program_options.hpp>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/dispatch.h"
#include "cli/options.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "results/deviation_file.h"
#include "results/keep_sets_file.h"
#include "kvcache/budget.h"
#include "policies/basis_set.h"
#include "sim/calibration.h"
#include "sim/chunk_deviation.h"
#include "sim/sweep.h"
#include "traces/synth_trace.h"
#include "traces/trace_check.h"
#include "traces/trace_reader.h"
#include "traces/trace_writer.h"

namespace po = boost::program_options;

namespace kvsim::cli {
namespace {

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %s", b, units[u]);
  return buf;
}

nlohmann::json info_json(const TraceReader& r) {
  const ModelGeometry& g = r.geometry();
  nlohmann::json j;
  j["file"] = r.path();
  j["format"] = kTraceFormat;
  j["version"] = kTraceVersion;
  j["file_bytes"] = std::filesystem::file_size(r.path());
  j["model"] = {{"name", g.name},
                {"arch", g.arch},
                {"n_layers", g.n_layers},
                {"n_q_heads", g.n_q_heads},
                {"n_kv_heads", g.n_kv_heads},
                {"head_dim", g.head_dim},
                {"vocab", g.vocab},
                {"rope_theta", g.rope.theta},
                {"rope_type", rope_type_name(g.rope.type)},
                {"rope_dim", g.rope.rope_dim},
                {"sliding_window", g.sliding_window},
                {"rope_theta_local", g.rope_theta_local}};
  const CaptureInfo& c = r.capture();
  j["capture"] = {{"tool_version", c.tool_version}, {"backend", c.backend}, {"date", c.date}, {"seed", c.seed}};
  nlohmann::json reqs = nlohmann::json::array();
  for (const auto& id : r.request_ids()) {
    const RequestHeader h = r.header(id);
    std::int64_t per_seg[kSegmentCount] = {};
    for (auto s : h.segments) ++per_seg[s];
    nlohmann::json seg;
    for (int s = 0; s < kSegmentCount; ++s) seg[segment_name(static_cast<Segment>(s))] = per_seg[s];
    reqs.push_back(
        {{"id", id},
         {"task", h.task},
         {"tokens", h.n_tokens()},
         {"queries", h.n_queries()},
         {"segments", seg},
         {"question_start", h.question_start},
         {"needle", h.needle_start >= 0 ? nlohmann::json::array({h.needle_start, h.needle_end}) : nlohmann::json()},
         {"ref_rows", h.ref_rows},
         {"ref_topk", h.ref_topk}});
  }
  j["requests"] = reqs;
  j["incomplete_requests"] = r.incomplete_request_ids();
  return j;
}

void print_info(const nlohmann::json& j, std::ostream& os) {
  const auto& m = j["model"];
  os << j["file"].get<std::string>() << ": kvtrace v" << j["version"] << ", "
     << human_bytes(j["file_bytes"].get<double>()) << "\n";
  os << "  model    " << m["name"].get<std::string>() << " (" << m["arch"].get<std::string>() << "): " << m["n_layers"]
     << " layers, " << m["n_q_heads"] << " q heads, " << m["n_kv_heads"] << " kv heads, head_dim " << m["head_dim"]
     << ", vocab " << m["vocab"] << ", rope " << m["rope_type"].get<std::string>() << " theta " << m["rope_theta"]
     << "\n";
  int local = 0, window = 0;
  for (const auto& w : m["sliding_window"])
    if (w.get<int>() > 0) ++local, window = w.get<int>();
  if (local > 0)
    os << "  windows  " << local << " of " << m["n_layers"] << " layers attend to the last " << window << " tokens"
       << (m["rope_theta_local"].get<double>() > 0
               ? ", rope theta " + std::to_string(m["rope_theta_local"].get<double>())
               : "")
       << "\n";
  const auto& c = j["capture"];
  os << "  capture  backend " << c["backend"].get<std::string>() << ", " << c["tool_version"].get<std::string>()
     << ", seed " << c["seed"] << ", " << c["date"].get<std::string>() << "\n";
  os << "  requests " << j["requests"].size() << " complete";
  if (!j["incomplete_requests"].empty()) os << ", " << j["incomplete_requests"].size() << " INCOMPLETE";
  os << "\n";
  os << "    " << std::left << std::setw(12) << "id" << std::right << std::setw(8) << "tokens" << std::setw(8)
     << "queries" << std::setw(8) << "system" << std::setw(9) << "context" << std::setw(10) << "question"
     << std::setw(11) << "generated" << std::setw(12) << "ref rows"
     << "  needle\n";
  for (const auto& r : j["requests"]) {
    const auto& s = r["segments"];
    auto n = [](const nlohmann::json& v) { return v.get<std::int64_t>(); };
    os << "    " << std::left << std::setw(12) << r["id"].get<std::string>() << std::right << std::setw(8)
       << n(r["tokens"]) << std::setw(8) << n(r["queries"]) << std::setw(8) << n(s["system"]) << std::setw(9)
       << n(s["context"]) << std::setw(10) << n(s["question"]) << std::setw(11) << n(s["generated"]) << std::setw(8)
       << n(r["ref_rows"]) << " x" << std::setw(3) << n(r["ref_topk"]) << "  ";
    if (r["needle"].is_array()) os << "[" << r["needle"][0] << ", " << r["needle"][1] << ")";
    os << "\n";
  }
  for (const auto& id : j["incomplete_requests"])
    os << "    " << id.get<std::string>() << "  INCOMPLETE: its writer stopped before committing it\n";
}

// Opens `path` (a file corrupt enough to crash the HDF5 library is refused by the open's probe,
// traces/trace_probe.h) and runs `fn` on it.
std::string with_trace(const std::string& path, const std::function<std::string(const TraceReader&)>& fn) {
  return fn(TraceReader(path));
}

int info(const Args& args) {
  po::options_description desc("kvsim trace info: summarise a kvtrace file");
  desc.add_options()("help,h", "show this help")("file", po::value<std::string>()->required(), "trace file")(
      "json", "print JSON instead of a table");
  po::positional_options_description pos;
  pos.add("file", 1);
  po::variables_map vm;
  if (!parse_options(args, desc, pos, vm, "kvsim trace info FILE [--json]")) return 0;
  const nlohmann::json j = nlohmann::json::parse(with_trace(vm["file"].as<std::string>(), [](const TraceReader& r) {
    return info_json(r).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }));
  if (vm.count("json"))
    std::cout << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  else
    print_info(j, std::cout);
  return 0;
}

int check(const Args& args) {
  po::options_description desc("kvsim trace check: validate a kvtrace file (schema, shapes, ranges, NaN/Inf)");
  desc.add_options()("help,h", "show this help")("file", po::value<std::string>()->required(), "trace file");
  po::positional_options_description pos;
  pos.add("file", 1);
  po::variables_map vm;
  if (!parse_options(args, desc, pos, vm, "kvsim trace check FILE")) return 0;
  const std::string file = vm["file"].as<std::string>();
  const TraceCheckReport report = check_trace_isolated(file);
  for (const auto& e : report.errors) std::cerr << "error: " << e << "\n";
  for (const auto& n : report.notes) std::cerr << "note: " << n << "\n";
  if (!report.ok()) {
    std::cerr << file << ": FAILED, " << report.errors.size() << " problem(s)\n";
    return 1;
  }
  std::cout << file << ": OK (" << report.requests_checked << " requests, " << report.tokens_checked
            << " tokens checked)\n";
  return 0;
}

// The curves as the deviation file holds them, and as a table.
results::DeviationFile deviation_rows(const std::vector<DeviationCurve>& curves, const std::string& trace) {
  results::DeviationFile f;
  f.trace = trace;
  for (const DeviationCurve& c : curves) {
    results::DeviationRow r{
        c.comparison,     c.layer, static_cast<long long>(c.deviation.size()), c.quantile(0.5), c.quantile(0.9),
        c.quantile(0.99), {}};
    for (const double x : results::kDeviationThresholds) r.above.push_back(c.share_above(x));
    f.rows.push_back(std::move(r));
  }
  return f;
}

int deviation(const Args& args) {
  std::string out;
  po::options_description desc(
      "kvsim trace deviation: how much chunks' KV depends on what came before them (docs/chunk-states.md), from a\n"
      "trace captured with --chunk-states: per layer, the relative deviation ||(k, v) - (k, v) in context|| /\n"
      "||(k, v) in context|| of each chunk token computed alone (after the header only), and of the same chunk in\n"
      "context in another request with another path before it (keys moved to this request's positions)");
  desc.add_options()("help,h", "show this help")("file", po::value<std::string>()->required(), "trace file")(
      "out,o", po::value(&out), "write the curves as CSV too")("force", "replace an existing --out file");
  po::positional_options_description pos;
  pos.add("file", 1);
  po::variables_map vm;
  add_output_flags(desc);
  if (!parse_options(args, desc, pos, vm, "kvsim trace deviation FILE [-o curves.csv]")) return 0;
  const std::string file = vm["file"].as<std::string>();
  if (!out.empty() && !vm.count("force") && std::filesystem::exists(out))
    throw Error(out + ": file exists; refusing to overwrite it (pass --force to replace)");
  results::DeviationFile f;
  with_trace(file, [&](const TraceReader& reader) {
    f = deviation_rows(chunk_deviation(reader), file);
    return std::string();
  });
  std::printf("%-11s %5s %8s %8s %8s %8s", "comparison", "layer", "tokens", "p50", "p90", "p99");
  for (const double x : results::kDeviationThresholds) std::printf("   >%-5g", x);
  std::printf("\n");
  for (const results::DeviationRow& r : f.rows) {
    std::printf("%-11s %5d %8lld %8.4f %8.4f %8.4f", r.comparison.c_str(), r.layer, r.tokens, r.p50, r.p90, r.p99);
    for (const double a : r.above) std::printf(" %8.3f", a);
    std::printf("\n");
  }
  if (!out.empty()) write_file_atomically(out, results::deviation_file_text(f));
  return 0;
}

int synth(const Args& args) {
  SynthConfig cfg;
  ModelGeometry& g = cfg.geometry;
  std::string out, queries = "all", rope_type = "norm";
  int deflate = 0, window = 0, global_every = 6;
  po::options_description desc(
      "kvsim trace synth: write a deterministic synthetic trace whose attention has sinks, recency, heavy\n"
      "hitters and needle-retrieval heads (built into K/Q, emerging from q.k); defaults: SmolLM2-135M geometry");
  desc.add_options()("help,h", "show this help")("out,o", po::value(&out)->required(), "output .h5 file")(
      "force", "overwrite an existing output file")("seed", po::value(&cfg.seed)->default_value(cfg.seed),
                                                    "random seed (written to the file)")(
      "requests", po::value(&cfg.n_requests)->default_value(cfg.n_requests), "number of requests")(
      "system", po::value(&cfg.system_tokens)->default_value(cfg.system_tokens), "system-prompt tokens")(
      "context", po::value(&cfg.context_tokens)->default_value(cfg.context_tokens), "context (document) tokens")(
      "question", po::value(&cfg.question_tokens)->default_value(cfg.question_tokens), "question tokens")(
      "generated", po::value(&cfg.generated_tokens)->default_value(cfg.generated_tokens), "generated tokens")(
      "needle", po::value(&cfg.needle_tokens)->default_value(cfg.needle_tokens), "needle span tokens")(
      "needle-depth", po::value(&cfg.needle_depth)->default_value(cfg.needle_depth),
      "needle start as a fraction of the context (< 0: request r of n at (r + 0.5) / n)")(
      "queries", po::value(&queries)->default_value(queries),
      "which queries to keep: all | eval (last --query-window context tokens + question + generated)")(
      "query-window", po::value(&cfg.query_window)->default_value(cfg.query_window), "see --queries eval")(
      "repeat-pass",
      "also write a synthetic KVzip reconstruction pass (the context repeated with its own queries and keys; "
      "needs --queries all)")("ref-topk", po::value(&cfg.ref_topk)->default_value(cfg.ref_topk),
                              "width of the reference top-k")(
      "heavy-fraction", po::value(&cfg.heavy_fraction)->default_value(cfg.heavy_fraction),
      "fraction of context tokens that are heavy hitters")(
      "retrieval-heads", po::value(&cfg.retrieval_head_fraction)->default_value(cfg.retrieval_head_fraction),
      "fraction of heads (past the first third of layers) that retrieve the needle")(
      "noise", po::value(&cfg.noise)->default_value(cfg.noise), "std of isotropic noise in K and Q")(
      "layers", po::value(&g.n_layers)->default_value(g.n_layers), "model layers")(
      "q-heads", po::value(&g.n_q_heads)->default_value(g.n_q_heads), "query heads")(
      "kv-heads", po::value(&g.n_kv_heads)->default_value(g.n_kv_heads), "key/value heads")(
      "head-dim", po::value(&g.head_dim)->default_value(g.head_dim), "head dimension")(
      "vocab", po::value(&g.vocab)->default_value(g.vocab), "vocabulary size")(
      "rope-theta", po::value(&g.rope.theta)->default_value(g.rope.theta), "RoPE base")(
      "rope-type", po::value(&rope_type)->default_value(rope_type), "RoPE pairing: norm | neox")(
      "sliding-window", po::value(&window)->default_value(window),
      "tokens a local layer attends to (Gemma 3-style; 0: every layer global)")(
      "global-every", po::value(&global_every)->default_value(global_every),
      "with --sliding-window: every this-many-th layer is global, the rest local")(
      "rope-theta-local", po::value(&g.rope_theta_local)->default_value(0.0),
      "RoPE base of local layers (0: --rope-theta)")("deflate", po::value(&deflate)->default_value(deflate),
                                                     "shuffle+deflate level 0-9 (0 = uncompressed)");
  po::positional_options_description pos;
  po::variables_map vm;
  add_output_flags(desc);
  if (!parse_options(args, desc, pos, vm, "kvsim trace synth --out FILE [options]")) return 0;
  if (queries != "all" && queries != "eval") throw Error("--queries is '" + queries + "', expected 'all' or 'eval'");
  cfg.all_queries = queries == "all";
  cfg.repeat_pass = vm.count("repeat-pass") > 0;
  g.rope.type = parse_rope_type(rope_type, "--rope-type");
  g.rope.rope_dim = g.rope.head_dim = g.head_dim;
  if (window < 0 || global_every < 1)
    throw Error("--sliding-window must be >= 0 and --global-every >= 1 (got " + std::to_string(window) + ", " +
                std::to_string(global_every) + ")");
  if (window > 0) {
    g.sliding_window.assign(static_cast<std::size_t>(g.n_layers), 0);
    for (int l = 0; l < g.n_layers; ++l)
      if (l % global_every < global_every - 1) g.sliding_window[static_cast<std::size_t>(l)] = window;
  }
  if (!vm["layers"].defaulted() || !vm["q-heads"].defaulted() || !vm["kv-heads"].defaulted() ||
      !vm["head-dim"].defaulted() || !vm["vocab"].defaulted())
    g.name = "synthetic";
  const auto problems = cfg.problems();
  if (!problems.empty()) {
    for (const auto& p : problems) std::cerr << "error: " << p << "\n";
    return 2;
  }
  TraceWriterOptions opts;
  opts.overwrite = vm.count("force") > 0;
  opts.deflate_level = deflate;
  // Write to a temporary name and rename on success: an interrupted synth leaves no half file
  // under the requested name, and never clobbers an existing one it was not allowed to.
  refuse_overwrite(out, opts.overwrite);
  const std::string tmp = out + ".partial";
  {
    TraceWriterOptions tmp_opts = opts;
    tmp_opts.overwrite = true;
    TraceWriter writer(tmp, g, synth_capture_info(cfg), tmp_opts);
    write_synth_trace(cfg, writer);
    writer.close();
  }
  std::filesystem::rename(tmp, out);
  TraceReader reader(out);
  print_info(info_json(reader), std::cout);
  return 0;
}

int dump(const Args& args) {
  std::string file, id, tensor;
  int layer = 0;
  po::options_description desc("kvsim trace dump: print one layer of K, V or Q of a request as JSON (f32)");
  desc.add_options()("help,h", "show this help")("file", po::value(&file)->required(), "trace file")(
      "request", po::value(&id)->required(), "request id")("tensor", po::value(&tensor)->required(), "k | v | q")(
      "layer", po::value(&layer)->required(), "layer index");
  po::positional_options_description pos;
  pos.add("file", 1);
  po::variables_map vm;
  if (!parse_options(args, desc, pos, vm, "kvsim trace dump FILE --request ID --tensor k|v|q --layer L")) return 0;
  Tensor t;
  if (tensor == "k")
    t = Tensor::K;
  else if (tensor == "v")
    t = Tensor::V;
  else if (tensor == "q")
    t = Tensor::Q;
  else
    throw Error("--tensor is '" + tensor + "', expected k, v or q");
  std::cout << with_trace(file, [&](const TraceReader& reader) {
    std::vector<float> values(reader.layer_elements(id, t));
    reader.read_layer(id, t, layer, values);
    const ModelGeometry& g = reader.geometry();
    const auto heads = static_cast<std::size_t>(t == Tensor::Q ? g.n_q_heads : g.n_kv_heads);
    nlohmann::json j;
    j["request"] = id;
    j["tensor"] = tensor;
    j["layer"] = layer;
    j["shape"] = {values.size() / heads / static_cast<std::size_t>(g.head_dim), heads, g.head_dim};
    j["values"] = values;
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }) << "\n";
  return 0;
}

// The tokens each config keeps in one request, per layer and plan entry, right after compression:
// what the report's attention map marks (analysis/report).
int keep_sets(const Args& args) {
  std::string file, id, policies, budgets = "0.25", mode = "query-aware", out, semantics = "point";
  int layer = -1;
  std::int64_t compress_every = 0, reapply_every = BudgetRule{}.every;
  po::options_description desc(
      "kvsim trace keep-sets: replay one request of a trace and write, for each (policy, budget) config, the\n"
      "tokens each layer's plan entries (KV heads, or query heads for per-query-head plans) keep right after\n"
      "compression, as JSON");
  desc.add_options()("help,h", "show this help")("file", po::value(&file)->required(), "trace file")(
      "request,r", po::value(&id), "request id (default: the first)")("policies,p", po::value(&policies)->required(),
                                                                      "policies, as for kvsim sweep")(
      "budgets,b", po::value(&budgets)->default_value(budgets), "budgets, as for kvsim sweep")(
      "mode", po::value(&mode)->default_value(mode), "query-aware | query-agnostic")(
      "layer,l", po::value(&layer)->default_value(layer), "one layer only (-1: every layer)")(
      "compress-every", po::value(&compress_every)->default_value(0), "as for kvsim sweep")(
      "budget-semantics", po::value(&semantics)->default_value(semantics), "point | peak, as for kvsim sweep")(
      "reapply-every", po::value(&reapply_every)->default_value(reapply_every), "as for kvsim sweep")(
      "out,o", po::value(&out)->required(), "output JSON")("force", "replace --out");
  po::positional_options_description pos;
  pos.add("file", 1);
  po::variables_map vm;
  add_output_flags(desc);
  if (!parse_options(args, desc, pos, vm, "kvsim trace keep-sets FILE [-r ID] -p snapkv,h2o -b 0.25 -o kept.json"))
    return 0;
  refuse_overwrite(out, vm.count("force") > 0);
  SweepSpec spec;
  spec.policies = split_policies(policies);
  spec.budgets = parse_budgets(budgets);
  spec.mode = parse_mode(mode);
  const std::vector<ReplayConfig> configs = expand_configs(spec);
  const std::string text = with_trace(file, [&](const TraceReader& reader) {
    const ModelGeometry& g = reader.geometry();
    if (layer < -1 || layer >= g.n_layers)
      throw Error("--layer " + std::to_string(layer) + ": expected -1 or a layer in [0, " + std::to_string(g.n_layers) +
                  ")");
    if (id.empty()) {
      if (reader.request_ids().empty()) throw Error(file + ": no complete request");
      id = reader.request_ids().front();
    }
    Replayer replayer(reader, spec.mode, configs, compress_every, parse_budget_rule(semantics, reapply_every));
    replayer.record_keep_sets(true);
    const RequestResult res = replayer.replay(id);
    results::KeepSetsFile f;
    f.trace = file, f.request = id, f.mode = mode_name(spec.mode);
    f.tokens = res.tokens, f.compression_point = res.compression_point, f.layers = g.n_layers, f.layer = layer;
    for (std::size_t p = 0; p < configs.size(); ++p) {
      auto kept = res.configs[p].kept;
      if (layer >= 0) kept = {kept[static_cast<std::size_t>(layer)]};
      f.configs.push_back(
          {configs[p].policy, configs[p].params, configs[p].label(), configs[p].budget, std::move(kept)});
    }
    return results::keep_sets_text(f);
  });
  write_file_atomically(out, text);
  std::printf("%s: keep-sets of %zu configs\n", out.c_str(), configs.size());
  return 0;
}

// Calibration bases for lowrank/varrate (basis=FILE): the principal directions of the
// pre-RoPE keys and of the values of every prompt token of the given traces, per (layer, KV head).
int fit_basis_cmd(const Args& args) {
  po::options_description desc(
      "kvsim trace fit-basis: fit low-rank bases (pre-RoPE keys, values) per layer and KV head on the prompt\n"
      "tokens of calibration traces; use them with lowrank:basis=FILE or varrate:basis=FILE");
  desc.add_options()("help,h", "show this help")("out,o", po::value<std::string>()->required(), "basis file to write")(
      "requests", po::value<int>()->default_value(0), "use at most this many requests per trace (0: all)")(
      "traces", po::value<std::vector<std::string>>()->multitoken()->required(), "calibration trace files");
  po::positional_options_description pos;
  pos.add("traces", -1);
  po::variables_map vm;
  add_output_flags(desc);
  if (!parse_options(args, desc, pos, vm, "kvsim trace fit-basis --out FILE TRACE...")) return 0;
  const auto traces = vm["traces"].as<std::vector<std::string>>();
  const std::string out = vm["out"].as<std::string>();
  refuse_overwrite(out, vm.count("force") > 0);
  const BasisSet set = fit_calibration_bases(traces, vm["requests"].as<int>());
  save_basis_set(set, out);
  std::cout << out << ": bases for " << set.n_layers << " layers x " << set.n_kv_heads << " KV heads (head_dim "
            << set.head_dim << ") from " << set.tokens << " prompt tokens of " << traces.size() << " trace(s)\n";
  return 0;
}

}  // namespace

int trace_command(const Args& args) {
  static const Subcommand subs[] = {
      {"info", "summarise a trace (geometry, capture, requests)", info},
      {"check", "validate a trace; non-zero exit and one line per problem", check},
      {"deviation", "how much chunks' KV depends on their context (traces with --chunk-states)", deviation},
      {"synth", "write a deterministic synthetic trace", synth},
      {"dump", "print one layer of K/V/Q of a request as JSON", dump},
      {"keep-sets", "the tokens each config keeps in one request, as JSON", keep_sets},
      {"fit-basis", "fit low-rank calibration bases (lowrank/varrate basis=FILE)", fit_basis_cmd}};
  return dispatch("kvsim trace", subs, args);
}

}  // namespace kvsim::cli
