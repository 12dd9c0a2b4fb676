// `kvsim serve`: the serving simulator (docs/serving.md). `hit-rate`: prefix-cache hit rates of a
// request trace over capacities and eviction policies, without timing.
#include <boost/program_options.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/dispatch.h"
#include "cli/options.h"
#include "core/error.h"
#include "serve/hit_rate.h"
#include "sim/csv.h"

namespace po = boost::program_options;

namespace kvsim::cli {

namespace {

std::vector<std::int64_t> parse_capacities(const std::string& s) {
  std::vector<std::int64_t> out;
  for (const std::string& v : split(s, ',')) {
    std::size_t used = 0;
    long long x = 0;
    try {
      x = std::stoll(v, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != v.size() || x < 1) throw Error("--capacity: '" + v + "' is not a block count >= 1");
    out.push_back(x);
  }
  if (out.empty()) throw Error("--capacity: no capacities given");
  return out;
}

int hit_rate_cmd(const Args& args) {
  std::string trace_path, capacities = "1000,2000,5000,10000,20000", evictions = "lru", out, json;
  double slru_protected = 0.8;
  po::options_description desc(
      "kvsim serve hit-rate: prefix-cache hit rates of a Mooncake request trace (JSONL: timestamp, input_length,\n"
      "output_length, hash_ids of 512-token blocks) per capacity and eviction policy, without timing. Requests in\n"
      "file order; a request's hit is its longest cached run of blocks from the first; then all its blocks are\n"
      "touched or inserted (docs/serving.md)");
  desc.add_options()("help,h", "show this help")("trace", po::value(&trace_path)->required(), "request trace (JSONL)")(
      "capacity,c", po::value(&capacities)->default_value(capacities), "capacities in blocks, comma-separated")(
      "eviction,e", po::value(&evictions)->default_value(evictions),
      "eviction policies, comma-separated: lru, lfu, slru, hits_per_token, rppc")(
      "slru-protected", po::value(&slru_protected)->default_value(slru_protected), "SLRU: protected share of the capacity")(
      "out,o", po::value(&out), "result CSV (one row per policy and capacity)")(
      "json", po::value(&json), "summary JSON (the rows, the trace and its reuse ceiling)")("force", "replace existing outputs");
  po::positional_options_description pos;
  pos.add("trace", 1);
  po::variables_map vm;
  if (!parse_options(args, desc, pos, vm, "kvsim serve hit-rate TRACE.jsonl [-c 1000,5000] [-e lru,rppc] [-o out.csv]"))
    return 0;
  for (const std::string& f : {out, json})
    if (!f.empty() && !vm.count("force") && std::filesystem::exists(f))
      throw Error(f + ": file exists; refusing to overwrite it (pass --force to replace)");
  const std::vector<std::int64_t> caps = parse_capacities(capacities);
  std::vector<serve::Eviction> kinds;
  for (const std::string& e : split(evictions, ',')) kinds.push_back(serve::parse_eviction(e));
  const serve::RequestTrace trace = serve::read_mooncake_trace(trace_path);
  const serve::BlockTree tree(trace);
  const serve::ReuseCeiling ceiling = serve::reuse_ceiling(trace);
  std::printf("%s: %zu requests, %lld block references, %lld distinct blocks; reuse ceiling %.4f of blocks, %.4f of "
              "tokens\n",
              trace_path.c_str(), trace.requests.size(), static_cast<long long>(trace.block_references()),
              static_cast<long long>(ceiling.distinct_blocks), ceiling.blocks, ceiling.tokens);
  std::printf("%-15s %10s %10s %10s %10s %12s\n", "eviction", "capacity", "block hit", "token hit", "evictions", "Mrefs/s");
  const std::vector<std::string> header = {"eviction", "capacity_blocks", "requests", "block_refs", "hit_blocks",
                                           "block_hit_rate", "tokens", "hit_tokens", "token_hit_rate", "evictions",
                                           "reuse_ceiling_blocks", "reuse_ceiling_tokens"};
  std::vector<std::vector<std::string>> rows;
  nlohmann::json summary = {{"trace", trace_path},
                            {"requests", trace.requests.size()},
                            {"block_refs", trace.block_references()},
                            {"distinct_blocks", ceiling.distinct_blocks},
                            {"reuse_ceiling_blocks", ceiling.blocks},
                            {"reuse_ceiling_tokens", ceiling.tokens},
                            {"results", nlohmann::json::array()}};
  for (const serve::Eviction kind : kinds)
    for (const std::int64_t cap : caps) {
      serve::EvictionOptions o;
      o.kind = kind;
      o.slru_protected = slru_protected;
      const serve::HitRateResult r = serve::hit_rate(tree, cap, o);
      std::printf("%-15s %10lld %10.4f %10.4f %10lld %12.1f\n", r.eviction.c_str(), static_cast<long long>(cap),
                  r.block_hit_rate(), r.token_hit_rate(), static_cast<long long>(r.evictions),
                  static_cast<double>(r.block_refs) / std::max(r.seconds, 1e-9) / 1e6);
      auto num = [](auto v) { return nlohmann::json(v).dump(); };
      rows.push_back({r.eviction, num(cap), num(r.requests), num(r.block_refs), num(r.hit_blocks), num(r.block_hit_rate()),
                      num(r.tokens), num(r.hit_tokens), num(r.token_hit_rate()), num(r.evictions), num(ceiling.blocks),
                      num(ceiling.tokens)});
      summary["results"].push_back({{"eviction", r.eviction},
                                    {"capacity_blocks", cap},
                                    {"block_hit_rate", r.block_hit_rate()},
                                    {"token_hit_rate", r.token_hit_rate()},
                                    {"hit_blocks", r.hit_blocks},
                                    {"hit_tokens", r.hit_tokens},
                                    {"evictions", r.evictions}});
    }
  if (!out.empty()) {
    std::ofstream f(out + ".partial");
    f << csv_line(header) << "\n";
    for (const auto& row : rows) f << csv_line(row) << "\n";
    if (!f.flush()) throw Error(out + ": cannot write");
    f.close();
    std::filesystem::rename(out + ".partial", out);
  }
  if (!json.empty()) {
    std::ofstream f(json + ".partial");
    f << summary.dump(2) << "\n";
    if (!f.flush()) throw Error(json + ": cannot write");
    f.close();
    std::filesystem::rename(json + ".partial", json);
  }
  return 0;
}

}  // namespace

int serve_command(const Args& args) {
  static const Subcommand subs[] = {
      {"hit-rate", "prefix-cache hit rates per capacity and eviction policy (no timing)", hit_rate_cmd}};
  return dispatch("kvsim serve", subs, args);
}

}  // namespace kvsim::cli
