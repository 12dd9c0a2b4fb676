// `kvsim sweep`: replay traces against many (policy, budget) configs in one pass.
#include <boost/program_options.hpp>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "policies/registry.h"
#include "sim/sweep.h"
#include "sim/sweep_merge.h"
#ifdef KVSIM_HAVE_MPI
#include "cli/mpi_ranks.h"
#include "cli/sweep_mpi.h"
#endif

namespace po = boost::program_options;

namespace kvsim::cli {
namespace {

void list_policies(std::ostream& os) {
  for (const PolicyInfo* p : PolicyRegistry::instance().all()) {
    os << p->name;
    for (const auto& alias : PolicyRegistry::instance().aliases_of(p->name)) os << " (also: " << alias << ")";
    os << "\n    " << p->description << "\n    cite: " << p->citation << "\n";
    for (const auto& s : p->params)
      os << "    " << std::left << std::setw(14) << (s.key + "=" + s.default_value) << " " << s.help << "\n";
  }
}

// `kvsim sweep merge`: the shards' result files joined into the serial sweep's.
int merge_command(const Args& args) {
  SweepMergeSpec spec;
  po::options_description desc(
      "kvsim sweep merge: join the result files of every shard of a sweep (kvsim sweep --shard i/n) into the\n"
      "file one serial sweep would have written, byte for byte; prints its ranked table");
  desc.add_options()("help,h", "show this help")("shard-file", po::value(&spec.inputs)->multitoken(),
                                                 "the shards' result CSVs, in any order")(
      "out,o", po::value(&spec.out_csv)->required(), "merged result CSV")(
      "detail-from", po::value(&spec.detail_inputs)->multitoken(),
      "the shards' --detail files, in the order of the CSVs")("detail", po::value(&spec.detail_jsonl),
                                                              "merged per-layer detail (with --detail-from)")(
      "force", "replace existing output files");
  po::positional_options_description pos;
  pos.add("shard-file", -1);
  po::variables_map vm;
  add_output_flags(desc);
  if (!parse_options(args, desc, pos, vm,
                     "kvsim sweep merge SHARD.csv... -o merged.csv [--detail-from D... --detail merged.jsonl]"))
    return 0;
  spec.force = vm.count("force") > 0;
  const auto rows = merge_sweeps(spec);
  std::cout << "kvsim sweep merge: " << spec.inputs.size() << " shards, results in " << spec.out_csv << "\n\n";
  print_summary(rows, std::cout);
  return 0;
}

// A JSON sweep file ({traces, policies, budgets, mode}) fills what the command line left unset:
// traces and policies when none were given, budgets and mode when they are the defaults.
void apply_sweep_file(const std::string& sweep_file, bool default_budgets, bool default_mode, bool no_policies,
                      SweepSpec& spec, std::string& budgets, std::string& mode) {
  std::ifstream in(sweep_file);
  if (!in) throw Error(sweep_file + ": cannot open sweep file");
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    throw Error(sweep_file + ": not valid JSON (" + e.what() + ")");
  }
  auto strings = [&](const char* key) {
    std::vector<std::string> v;
    if (!j.contains(key)) return v;
    if (!j[key].is_array()) throw Error(sweep_file + ": field '" + key + "' must be an array of strings");
    for (const auto& x : j[key]) {
      if (!x.is_string()) throw Error(sweep_file + ": field '" + key + "' must be an array of strings");
      v.push_back(x.get<std::string>());
    }
    return v;
  };
  if (spec.traces.empty()) spec.traces = strings("traces");
  if (no_policies) spec.policies = strings("policies");
  if (default_budgets && j.contains("budgets")) {
    if (!j["budgets"].is_array()) throw Error(sweep_file + ": field 'budgets' must be an array of numbers");
    budgets.clear();
    for (const auto& x : j["budgets"]) {
      if (!x.is_number()) throw Error(sweep_file + ": field 'budgets' must be an array of numbers");
      budgets += (budgets.empty() ? "" : ",") + x.dump();
    }
  }
  if (default_mode && j.contains("mode")) {
    if (!j["mode"].is_string()) throw Error(sweep_file + ": field 'mode' must be a string");
    mode = j["mode"].get<std::string>();
  }
}

}  // namespace

int sweep_command(const Args& args) {
  if (!args.empty() && args.front() == "merge") return merge_command(Args(args.begin() + 1, args.end()));
  SweepSpec spec;
  std::string shard;
  std::string policies, budgets = "0.1,0.25,0.5", mode = "query-aware", sweep_file, semantics = "point";
  std::int64_t reapply_every = BudgetRule{}.every;
  po::options_description desc(
      "kvsim sweep: replay traces against every (policy, budget) config in one pass per request;\n"
      "writes a tidy CSV (one row per trace x request x policy x budget) and prints a ranked table");
  desc.add_options()("help,h", "show this help")("trace", po::value(&spec.traces)->multitoken(), "trace files")(
      "policies,p", po::value(&policies), "policies: name[:key=value,...] separated by ',' or ';'")(
      "budgets,b", po::value(&budgets)->default_value(budgets),
      "budgets: fractions of the full fp16 KV bytes at the compression point, in (0, 1]")(
      "mode", po::value(&mode)->default_value(mode),
      "query-aware (compress after the question) | query-agnostic (compress the context before it)")(
      "compress-every", po::value(&spec.compress_every)->default_value(0),
      "let the policy cut the cache back to its budget at every N prompt tokens where it exceeds it, as a "
      "chunked prefill would (0: one compression at the compression point); verify takes the same flag")(
      "prefill-chunk", po::value<std::int64_t>(), "renamed --compress-every (a sweep runs no forward passes)")(
      "budget-semantics", po::value(&semantics)->default_value(semantics),
      "point: the byte budget holds at the compression point (later tokens join on top); peak: at every step "
      "after it, decode-time state included (one-shot policies re-apply their rule, see --reapply-every)")(
      "reapply-every", po::value(&reapply_every)->default_value(reapply_every),
      "peak semantics: a one-shot policy compresses this many tokens below its budget and re-applies its rule "
      "each time the cache reaches the budget again (at most half the budget)")(
      "out,o", po::value(&spec.out_csv)->default_value("sweep.csv"), "result CSV")(
      "detail", po::value(&spec.detail_jsonl), "per-layer metrics as JSON lines (optional)")(
      "estimator", po::value(&spec.estimator),
      "a `kvsim calibrate` file: fill the est_kl column, the offline estimate of live KL (docs/estimator.md)")(
      "sweep-file", po::value(&sweep_file), "JSON sweep file: {traces, policies, budgets, mode} (CLI values win)")(
      "resume", "continue an interrupted sweep in --out (same configuration only)")(
      "shard", po::value(&shard),
      "i/n: sweep only every n-th request from the i-th (0 <= i < n), over all traces in order; "
      "`kvsim sweep merge` joins the n result files into the serial sweep's")("force", "replace an existing --out")(
      "quiet,q", "no progress line")("allow-training-requests",
                                     "let learned policies run on the prompts they were trained on")(
      "list-policies", "list every policy with its rule, citation and parameters, then exit");
  po::positional_options_description pos;
  pos.add("trace", -1);
  po::variables_map vm;
  add_output_flags(desc);
  if (!parse_options(args, desc, pos, vm,
                     "kvsim sweep TRACE... --policies snapkv,h2o --budgets 0.1,0.25,0.5 [options]\n       kvsim sweep "
                     "merge SHARD.csv... -o merged.csv"))
    return 0;
  if (vm.count("prefill-chunk"))
    throw Error(
        "--prefill-chunk is a forward-pass size (capture, verify); a sweep's compression schedule is "
        "--compress-every N");
  if (vm.count("list-policies")) {
    list_policies(std::cout);
    return 0;
  }
  if (!sweep_file.empty())
    apply_sweep_file(sweep_file, vm["budgets"].defaulted(), vm["mode"].defaulted(), policies.empty(), spec, budgets,
                     mode);
  if (!policies.empty()) spec.policies = split_policies(policies);
  spec.budgets = parse_budgets(budgets);
  spec.mode = parse_mode(mode);
  spec.budget_rule = parse_budget_rule(semantics, reapply_every);
  if (!shard.empty()) std::tie(spec.shard, spec.shards) = parse_shard(shard);
  spec.resume = vm.count("resume") > 0;
  spec.force = vm.count("force") > 0;
  spec.allow_training_requests = vm.count("allow-training-requests") > 0;
  spec.progress = vm.count("quiet") == 0;
  if (spec.traces.empty()) throw Error("no trace files given (kvsim sweep TRACE... or \"traces\" in --sweep-file)");
#ifdef KVSIM_HAVE_MPI
  if (mpi_launched()) {
    std::vector<SweepSummaryRow> mpi_rows;
    if (run_sweep_mpi(spec, mpi_rows, std::cerr)) {
      std::cout << "kvsim sweep (MPI): " << spec.traces.size() << " trace(s), " << mode_name(spec.mode)
                << ", results in " << spec.out_csv << "\n\n";
      print_summary(mpi_rows, std::cout);
      return 0;
    }
  }
#endif
  const auto rows = run_sweep(spec, std::cerr);
  std::cout << "kvsim sweep: " << spec.traces.size() << " trace(s), " << mode_name(spec.mode) << ", results in "
            << spec.out_csv << "\n\n";
  print_summary(rows, std::cout);
  return 0;
}

}  // namespace kvsim::cli
