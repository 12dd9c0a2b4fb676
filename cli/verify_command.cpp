// `kvsim verify`: live compressed-cache runs of (policy, budget) configs and their agreement
// with the offline sweep.
#include <boost/program_options.hpp>
#include <iostream>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "verify/verify_run.h"

namespace po = boost::program_options;

namespace kvsim::cli {

int verify_command(const Args& args) {
  VerifySpec spec;
  std::string policies, reuse, budgets = "0.1,0.25,0.5", mode = "query-aware", queries = "all", weights = "quant",
                               device = "cpu", steps = "engine", semantics = "point";
  std::int64_t reapply_every = BudgetRule{}.every;
  po::options_description desc(
      "kvsim verify: run (policy, budget) configs live on the model with a really compressed KV cache, against\n"
      "the full-cache run (next-token KL teacher-forced on its continuation, top-1, perplexity, task score of\n"
      "free generation), and report how well a sweep's offline metrics rank them");
  desc.add_options()("help,h", "show this help")("model,m", po::value(&spec.model_path)->required(), "GGUF model file")(
      "tasks,t", po::value(&spec.tasks_path)->required(), "JSONL requests (as for kvsim capture)")(
      "policies,p", po::value(&policies), "policies: name[:key=value,...] separated by ',' or ';'")(
      "budgets,b", po::value(&budgets)->default_value(budgets),
      "budgets: fractions of the full fp16 KV bytes, in (0, 1]")(
      "chunk-reuse", po::value(&reuse),
      "chunked requests, query-agnostic: serve each chunk's KV from another state, ','-separated: recompute | "
      "stateless (computed alone, keys moved) | transition:share=S (CacheBlend: the top S of tokens by layer-1 "
      "deviation recomputed); docs/chunk-states.md")(
      "from-sweep", po::value(&spec.from_sweep),
      "take the --top configs (by offline mean KL) of this sweep result CSV")(
      "top", po::value(&spec.top)->default_value(spec.top), "see --from-sweep")(
      "offline", po::value(&spec.offline_csv), "sweep result CSV to compare with (implied by --from-sweep)")(
      "detail", po::value(&spec.offline_detail), "that sweep's --detail JSONL: adds per-layer offline metrics")(
      "estimator", po::value(&spec.estimator),
      "a `kvsim calibrate` file: add its est_kl to the agreement (needs --detail); the requests it was fitted on are "
      "left "
      "out of the agreement")("mode", po::value(&mode)->default_value(mode),
                              "query-aware | query-agnostic (a sweep's own mode wins)")(
      "max-new", po::value(&spec.live.max_new)->default_value(spec.live.max_new),
      "reference continuation tokens (>= 2)")(
      "min-new", po::value(&spec.live.min_new)->default_value(spec.live.min_new),
      "no end of generation before this many tokens (the best other token is taken; use the capture's --min-new)")(
      "queries", po::value(&queries)->default_value(queries),
      "all | eval: prompt queries the policies may read (eval: the last "
      "--query-window context tokens and the question)")(
      "query-window", po::value(&spec.live.query_window)->default_value(spec.live.query_window), "see --queries eval")(
      "prefill-chunk", po::value(&spec.live.prefill_chunk)->default_value(spec.live.prefill_chunk),
      "tokens per prefill pass (capture's default, so keep-sets match a captured trace exactly)")(
      "compress-every", po::value(&spec.live.compress_every)->default_value(spec.live.compress_every),
      "let the policy cut the cache back to its budget at every N prompt tokens where it exceeds it, as sweep "
      "--compress-every simulates (0: one compression at the compression point). With --from-sweep/--offline the "
      "sweep's own value is used and a different one refused. A multiple of --prefill-chunk keeps the forward "
      "passes where capture ran them")(
      "budget-semantics", po::value(&semantics)->default_value(semantics),
      "point | peak: when the byte budget holds, as sweep --budget-semantics (a sweep's own wins)")(
      "reapply-every", po::value(&reapply_every)->default_value(reapply_every),
      "peak semantics: the one-shot policies' re-application cadence in tokens, as sweep --reapply-every")(
      "weights", po::value(&weights)->default_value(weights), "quant | f32 (see kvsim capture --help)")(
      "device", po::value(&device)->default_value(device), "cpu | cuda (see kvsim capture --help)")(
      "policy-steps", po::value(&steps)->default_value(steps),
      "engine | host: where decode-time rules (h2o, tova) step; engine: on the GPU with --device cuda (no cache rows "
      "or "
      "attention weights to the host), on the host otherwise. Both evict the same tokens")(
      "out,o", po::value(&spec.out_csv)->default_value(spec.out_csv), "per request x config results (CSV)")(
      "agreement", po::value(&spec.agreement_csv), "write the agreement table as CSV too")(
      "force", "replace an existing --out file")("quiet,q", "no progress lines")(
      "allow-training-requests", "let learned policies run on the prompts they were trained on");
  po::variables_map vm;
  add_output_flags(desc);
  if (!parse_options(
          args, desc, po::positional_options_description(), vm,
          "kvsim verify --model M.gguf --tasks T.jsonl (--policies P --budgets B | --from-sweep S.csv --top N) "
          "[--offline S.csv] [options]"))
    return 0;
  if (spec.from_sweep.empty() && policies.empty() && reuse.empty())
    throw Error("no configs: give --policies (and --budgets), --from-sweep or --chunk-reuse");
  if (!spec.from_sweep.empty() && !policies.empty()) throw Error("--policies and --from-sweep exclude each other");
  if (!spec.from_sweep.empty() && !spec.offline_csv.empty())
    throw Error("--offline is implied by --from-sweep; give one");
  if (queries != "all" && queries != "eval") throw Error("--queries is '" + queries + "', expected all or eval");
  if (steps != "engine" && steps != "host") throw Error("--policy-steps is '" + steps + "', expected engine or host");
  spec.live.rules_in_engine = steps == "engine";
  spec.policies = policies.empty() ? std::vector<std::string>{} : split_policies(policies);
  for (const std::string& way : split(reuse, ',')) spec.reuse.push_back(parse_reuse(way));
  spec.budgets = parse_budgets(budgets);
  spec.live.mode = parse_mode(mode);
  spec.mode_given = !vm["mode"].defaulted();
  spec.compress_every_given = !vm["compress-every"].defaulted();
  spec.live.budget_rule = parse_budget_rule(semantics, reapply_every);
  spec.budget_rule_given = !vm["budget-semantics"].defaulted() || !vm["reapply-every"].defaulted();
  spec.live.all_queries = queries == "all";
  spec.live.weights = parse_weight_format(weights);
  spec.live.device = parse_device(device);
  require_device(spec.live.device);
  spec.force = vm.count("force") > 0;
  spec.live.allow_training_requests = vm.count("allow-training-requests") > 0;
  spec.progress = vm.count("quiet") == 0;
  run_verify(spec, std::cout, std::cerr);
  return 0;
}

}  // namespace kvsim::cli
