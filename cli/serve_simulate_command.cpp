// `kvsim serve simulate`: the timed serving simulation over a grid of eviction policies, HBM
// capacities and KV compression configs (docs/serving.md).
#include <unistd.h>

#include <boost/program_options.hpp>
#include <cmath>
#include <filesystem>
#include <cstdio>

#include "cli/options.h"
#include "cli/serve_commands.h"
#include "cli/serve_grid.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "results/serve_file.h"
#include "core/sha256.h"
#include "serve/simulator.h"

namespace po = boost::program_options;

namespace kvsim::cli {

namespace {

std::vector<double> parse_sizes(const std::string& s, const std::string& flag) {
  std::vector<double> out;
  for (const std::string& v : split(s, ',')) {
    std::size_t used = 0;
    double x = 0;
    try {
      x = std::stod(v, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != v.size() || !(x > 0)) throw Error(flag + ": '" + v + "' is not a size in GB > 0");
    out.push_back(x);
  }
  if (out.empty()) throw Error(flag + ": no values given");
  return out;
}

nlohmann::json number_or_null(double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(); }

// Percentiles of no samples (every request rejected) are written empty, not as 0 ms.
void add_percentiles(nlohmann::json& row, const std::string& name, const serve::Percentiles& p, bool with_mean) {
  const bool any = p.count > 0;
  row[name + "_p50_ms"] = any ? nlohmann::json(p.p50) : nlohmann::json();
  row[name + "_p90_ms"] = any ? nlohmann::json(p.p90) : nlohmann::json();
  row[name + "_p99_ms"] = any ? nlohmann::json(p.p99) : nlohmann::json();
  if (with_mean) row[name + "_mean_ms"] = any ? nlohmann::json(p.mean) : nlohmann::json();
}

nlohmann::json result_row(const serve::SimResult& r, const serve::SimOptions& o, const KvPolicyRow& kv) {
  using serve::Way;
  nlohmann::json row = {{"eviction", serve::eviction_name(o.eviction)},
                        {"hbm_gb", o.hbm_gb},
                        {"kv_policy", kv.spec},
                        {"kv_config", kv.label},
                        {"kv_ratio", kv.ratio},
                        {"requests", r.requests},
                        {"completed", r.completed},
                        {"rejected", r.rejected},
                        {"hit_rate", r.hit_rate()},
                        {"hbm_share", r.share(Way::Hbm)},
                        {"dram_share", r.share(Way::LoadDram)},
                        {"ssd_share", r.share(Way::LoadSsd)},
                        {"transition_share", r.share(Way::Transition)},
                        {"recompute_share", r.share(Way::Recompute)},
                        {"loaded_dram_gb", r.loaded_gb[1]},
                        {"loaded_ssd_gb", r.loaded_gb[2]},
                        {"written_dram_gb", r.written_gb[1]},
                        {"written_ssd_gb", r.written_gb[2]},
                        {"throughput_tokens_s", r.throughput_tokens_s},
                        {"throughput_requests_s", r.throughput_requests_s},
                        {"makespan_s", r.makespan_s},
                        {"prefill_tokens", r.prefill_tokens},
                        {"output_tokens", r.output_tokens},
                        {"planned_ms", r.planned_ms},
                        {"recompute_only_ms", r.recompute_only_ms},
                        {"load_only_ms", r.load_only_ms},
                        {"est_kl", number_or_null(kv.est_kl)},
                        {"mean_kl", number_or_null(kv.mean_kl)},
                        {"live_kl", number_or_null(kv.live_kl)},
                        {"top1", number_or_null(kv.top1)},
                        {"task_score", number_or_null(kv.task_score)},
                        {"steps", r.steps},
                        {"evictions", r.evictions},
                        {"seconds", r.seconds}};
  add_percentiles(row, "ttft", r.ttft_ms, true);
  row["ttft_centiles_ms"] = r.ttft_centiles_ms;  // JSON only: the TTFT CDF
  add_percentiles(row, "tbt", r.tbt_ms, false);
  add_percentiles(row, "queue", r.queue_ms, false);
  // JSON only: load against capacity (serve/simulator.h LoadReport).
  row["arrival_span_s"] = r.load.arrival_span_ms / 1e3;
  row["offered_load"] = r.load.offered_load;
  row["ttft_first_quarter_ms"] = r.load.ttft_first_ms;
  row["ttft_last_quarter_ms"] = r.load.ttft_last_ms;
  row["overloaded"] = r.load.overloaded;
  row["suggested_instances"] = r.load.suggested_instances;
  return row;
}

// An overloaded point says so, with the load and the instance count that would hold it (rows
// resumed from an older progress file carry no load fields and print nothing).
void warn_overload(const nlohmann::json& row, int instances) {
  if (!row.contains("overloaded") || !row["overloaded"].get<bool>()) return;
  std::fflush(stdout);  // after the row it is about
  std::fprintf(stderr,
               "kvsim serve simulate: warning: %s at %.3g GB, kv %s is overloaded: offered load %.2f (the instances' "
               "busy time over %d instance(s) x %.1f s of arrivals); the mean TTFT grew from %.0f ms (first "
               "quarter of arrivals) to %.0f ms (last quarter), so latencies here measure the backlog. About %d "
               "instances (--instances) would hold this load at 80%% busy, or slow the arrivals (--time-scale < 1).\n",
               row.at("eviction").get<std::string>().c_str(), row.at("hbm_gb").get<double>(),
               row.at("kv_policy").get<std::string>().c_str(), row.at("offered_load").get<double>(), instances,
               row.at("arrival_span_s").get<double>(), row.at("ttft_first_quarter_ms").get<double>(),
               row.at("ttft_last_quarter_ms").get<double>(), row.at("suggested_instances").get<int>());
}

// The options' ranges, checked here so that an error names the flag (the simulator checks them
// again for other callers).
void check_flags(const serve::SimOptions& o) {
  auto need = [](bool ok, const std::string& flag, double got, const std::string& expected) {
    if (!ok) throw Error(flag + ": got " + std::to_string(got) + "; expected " + expected);
  };
  need(o.instances >= 1, "--instances", o.instances, ">= 1");
  need(o.dram.capacity_gb >= 0, "--dram-gb", o.dram.capacity_gb, ">= 0 (0: no DRAM tier)");
  need(o.dram.capacity_gb == 0 || o.dram.gbps > 0, "--dram-gbps", o.dram.gbps, "> 0 with a DRAM tier");
  need(o.dram.latency_ms >= 0, "--dram-latency-ms", o.dram.latency_ms, ">= 0");
  need(o.ssd.capacity_gb >= 0, "--ssd-gb", o.ssd.capacity_gb, ">= 0 (0: no SSD tier)");
  need(o.ssd.capacity_gb == 0 || o.ssd.gbps > 0, "--ssd-gbps", o.ssd.gbps, "> 0 with an SSD tier");
  need(o.ssd.latency_ms >= 0, "--ssd-latency-ms", o.ssd.latency_ms, ">= 0");
  need(o.max_batch_tokens >= 1, "--max-batch-tokens", static_cast<double>(o.max_batch_tokens), ">= 1");
  need(o.max_seqs >= 1, "--max-seqs", o.max_seqs, ">= 1");
  need(o.slru_protected > 0 && o.slru_protected <= 1, "--slru-protected", o.slru_protected, "a share in (0, 1]");
  need(o.transition_diff > 0 && o.transition_diff <= 1, "--transition-diff", o.transition_diff, "a share in (0, 1]");
  need(o.kv_page_tokens >= 1, "--kv-page-tokens", static_cast<double>(o.kv_page_tokens), ">= 1");
  need(o.time_scale > 0, "--time-scale", o.time_scale, "> 0");
}

struct Flags {
  std::string trace, profile = "llama2-7b-h100", evictions = "lru", hbm = "8", kv_policy = "none", kv_results,
                     route = "prefix";
  std::string out, json;
  serve::SimOptions o;
};

void describe(po::options_description& desc, Flags& f) {
  serve::SimOptions& o = f.o;
  desc.add_options()("help,h", "show this help")("trace", po::value(&f.trace)->required(),
                                                 "request trace (Mooncake JSONL, or chunked: docs/chunk-states.md)")(
      "profile,p", po::value(&f.profile)->default_value(f.profile),
      "cost profile: built-in name or JSON file (kvsim serve profile)")(
      "eviction,e", po::value(&f.evictions)->default_value(f.evictions),
      "eviction policies, comma-separated: lru, lfu, slru, hits_per_token, rppc")(
      "hbm-gb", po::value(&f.hbm)->default_value(f.hbm),
      "HBM KV space per instance in GB, comma-separated for a sweep")(
      "dram-gb", po::value(&o.dram.capacity_gb)->default_value(0), "host DRAM tier per instance, GB (0: none)")(
      "dram-gbps", po::value(&o.dram.gbps)->default_value(25), "DRAM to HBM bandwidth, GB/s")(
      "dram-latency-ms", po::value(&o.dram.latency_ms)->default_value(0.01), "DRAM per-transfer latency, ms")(
      "ssd-gb", po::value(&o.ssd.capacity_gb)->default_value(0), "SSD tier per instance, GB (0: none)")(
      "ssd-gbps", po::value(&o.ssd.gbps)->default_value(5), "SSD to HBM bandwidth, GB/s")(
      "ssd-latency-ms", po::value(&o.ssd.latency_ms)->default_value(0.1), "SSD per-transfer latency, ms")(
      "instances", po::value(&o.instances)->default_value(o.instances), "serving instances")(
      "route", po::value(&f.route)->default_value(f.route), "request routing: prefix, round-robin, least-loaded")(
      "max-batch-tokens", po::value(&o.max_batch_tokens)->default_value(o.max_batch_tokens),
      "tokens per step (decodes + prefill chunks)")("max-seqs", po::value(&o.max_seqs)->default_value(o.max_seqs),
                                                    "running sequences per instance")(
      "slru-protected", po::value(&o.slru_protected)->default_value(o.slru_protected), "SLRU: protected share")(
      "transitions", "materialise blocks by transitions from cached siblings too")(
      "transition-diff", po::value(&o.transition_diff)->default_value(o.transition_diff),
      "share of a sibling's tokens a transition recomputes (an assumption: the trace's hashes cannot tell)")(
      "kv-policy", po::value(&f.kv_policy)->default_value(f.kv_policy),
      "KV compression configs, ';'-separated: none, or POLICY[:k=v,...]@BUDGET measured in --kv-results")(
      "kv-results", po::value(&f.kv_results),
      "sweep and/or verify CSVs, comma-separated, that measured the --kv-policy configs")(
      "kv-page-tokens", po::value(&o.kv_page_tokens)->default_value(o.kv_page_tokens),
      "a compressed block's tokens round up to pages of this size")(
      "time-scale", po::value(&o.time_scale)->default_value(o.time_scale),
      "arrival rate multiplier (timestamps divided by it)")(
      "out,o", po::value(&f.out), "result CSV, one row per eviction x HBM size x KV config")("json", po::value(&f.json),
                                                                                             "summary JSON")(
      "resume", "continue a run that was stopped: its finished rows are kept in OUT.progress")(
      "quiet,q", "no progress line")("force", "replace existing outputs");
}

// What a grid's rows depend on, for --resume: every flag, the trace's and the profile file's
// content, and every KV config's measured ratio and fidelity.
nlohmann::json grid_config(const Flags& f, const nlohmann::json& summary, const std::vector<KvPolicyRow>& kvs) {
  nlohmann::json c = summary;
  c.erase("results");
  c["command"] = "serve simulate";
  c["trace_sha256"] = sha256_file_hex(f.trace);
  c["evictions"] = f.evictions;
  c["hbm_gb"] = f.hbm;
  c["profile_spec"] = f.profile;
  if (std::filesystem::is_regular_file(f.profile)) c["profile_sha256"] = sha256_file_hex(f.profile);
  c["tiers"] = {f.o.dram.gbps, f.o.dram.latency_ms, f.o.ssd.gbps, f.o.ssd.latency_ms};
  c["slru_protected"] = f.o.slru_protected;
  for (const KvPolicyRow& kv : kvs)
    c["kv"].push_back({kv.spec, kv.label, kv.ratio, number_or_null(kv.est_kl), number_or_null(kv.mean_kl),
                       number_or_null(kv.live_kl), number_or_null(kv.top1), number_or_null(kv.task_score)});
  return c;
}

// A result row as the table prints it (from the row, so resumed rows print the same).
void print_row(const nlohmann::json& row, const KvPolicyRow& kv) {
  auto num = [&](const char* key) { return row.at(key).is_number() ? row.at(key).get<double>() : std::nan(""); };
  std::printf("%-15s %7.3g %-28s %6.3f %6lld %7.4f %9.1f %9.1f %8.2f %9.1f %9.1f\n",
              row.at("eviction").get<std::string>().c_str(), num("hbm_gb"), kv.label.substr(0, 28).c_str(), kv.ratio,
              row.at("completed").is_number() ? row.at("completed").get<long long>() : -1LL, num("hit_rate"),
              num("ttft_p50_ms"), num("ttft_p99_ms"), num("tbt_p50_ms"), num("queue_p99_ms"),
              num("throughput_tokens_s"));
}

}  // namespace

int serve_simulate(const Args& args) {
  Flags f;
  po::options_description desc(
      "kvsim serve simulate: timed serving simulation of a request trace (Mooncake or chunked). Requests arrive at "
      "their\n"
      "timestamps, are routed to instances, wait for HBM, reuse cached prefix blocks (from HBM, or loaded from\n"
      "DRAM / SSD when loading beats recomputing), and run under continuous batching with chunked prefill; step\n"
      "times come from a cost profile. Reports hit rates per tier, tier traffic, TTFT, time between tokens,\n"
      "queueing delay and throughput per eviction policy, HBM size and KV compression config (docs/serving.md)");
  describe(desc, f);
  po::positional_options_description pos;
  pos.add("trace", 1);
  po::variables_map vm;
  add_output_flags(desc);
  if (!parse_options(args, desc, pos, vm,
                     "kvsim serve simulate TRACE.jsonl [-e lru,rppc] [--hbm-gb 4,8] [--kv-policy 'none;snapkv@0.25' "
                     "--kv-results sweep.csv] [-o out.csv]"))
    return 0;
  check_flags(f.o);
  f.o.transitions = vm.count("transitions") > 0;
  f.o.route = serve::parse_route(f.route);
  f.o.profile = serve::load_profile(f.profile);
  std::vector<serve::Eviction> kinds;
  for (const std::string& e : split(f.evictions, ',')) kinds.push_back(serve::parse_eviction(e));
  const std::vector<double> hbm = parse_sizes(f.hbm, "--hbm-gb");
  const std::vector<KvPolicyRow> kvs =
      read_kv_policies(f.kv_policy, f.kv_results.empty() ? std::vector<std::string>{} : split(f.kv_results, ','));
  nlohmann::json summary = {{"trace", f.trace},
                            {"profile", f.o.profile.name},
                            {"instances", f.o.instances},
                            {"route", f.route},
                            {"dram_gb", f.o.dram.capacity_gb},
                            {"ssd_gb", f.o.ssd.capacity_gb},
                            {"transitions", f.o.transitions},
                            {"transition_diff", f.o.transition_diff},
                            {"max_batch_tokens", f.o.max_batch_tokens},
                            {"max_seqs", f.o.max_seqs},
                            {"kv_page_tokens", f.o.kv_page_tokens},
                            {"time_scale", f.o.time_scale},
                            {"results", nlohmann::json::array()}};
  ServeGrid grid;
  grid.points = kvs.size() * kinds.size() * hbm.size();
  grid.progress = grid_progress_path(f.out, f.json);
  grid.resume = vm.count("resume") > 0;
  grid.force = vm.count("force") > 0;
  grid.config = grid_config(f, summary, kvs);
  grid.row_template = result_row(serve::SimResult{}, f.o, kvs.front());
  if (grid_finished(grid, {f.out, f.json})) return 0;
  refuse_grid_overwrite(grid, {f.out, f.json});
  const serve::RequestTrace trace = serve::read_serve_trace(f.trace);
  const serve::BlockTree tree(trace);
  const bool quiet = grid_worker_rank();
  const bool tty = !vm.count("quiet") && !quiet && ::isatty(2);
  if (!quiet)
    std::printf(
        "%s: %zu requests; profile %s; %d instance(s), route %s (done: requests completed; the rest were larger "
        "than an instance's HBM)\n",
        f.trace.c_str(), trace.requests.size(), f.o.profile.name.c_str(), f.o.instances, f.route.c_str());
  if (!quiet)
    std::printf("%-15s %7s %-28s %6s %6s %7s %9s %9s %8s %9s %9s\n", "eviction", "HBM GB", "kv", "ratio", "done", "hit",
                "TTFT p50", "TTFT p99", "TBT p50", "queue p99", "tok/s");
  // Point p in the serial order: KV config, then eviction, then HBM size.
  grid.run = [&](std::size_t p) {
    const KvPolicyRow& kv = kvs[p / (kinds.size() * hbm.size())];
    const serve::Eviction kind = kinds[p / hbm.size() % kinds.size()];
    const double gb = hbm[p % hbm.size()];
    serve::SimOptions o = f.o;
    o.eviction = kind;
    o.hbm_gb = gb;
    o.kv_ratio = kv.ratio;
    if (tty)
      o.progress = [&](double ms, std::int64_t done, std::int64_t all) {
        std::fprintf(stderr, "\r%s %s %.3g GB: simulated %.1f s, %lld/%lld requests done   ",
                     serve::eviction_name(kind).c_str(), kv.spec.c_str(), gb, ms / 1e3, static_cast<long long>(done),
                     static_cast<long long>(all));
      };
    const serve::SimResult r = serve::simulate(tree, o);
    if (tty) std::fprintf(stderr, "\r%*s\r", 100, "");
    return result_row(r, o, kv);
  };
  grid.report = [&](std::size_t p, const nlohmann::json& row) {
    if (quiet) return;
    print_row(row, kvs[p / (kinds.size() * hbm.size())]);
    warn_overload(row, f.o.instances);
  };
  for (nlohmann::json& row : run_grid(grid)) summary["results"].push_back(std::move(row));
  if (!f.out.empty()) write_file_atomically(f.out, results::serve_csv_text(results::ServeKind::Simulate, summary));
  if (!f.json.empty()) write_file_atomically(f.json, results::serve_json_text(summary));
  finish_grid(grid);
  return 0;
}

}  // namespace kvsim::cli
