// `kvsim train METHOD TRACE... -o MODEL.h5`: train a learned policy on captured traces.
#include <unistd.h>

#include <boost/program_options.hpp>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "train/distillcache_trainer.h"
#include "train/foresight_trainer.h"
#include "train/rlkv_trainer.h"
#include "train/sigmoid_gate_trainer.h"
#include "traces/trace_reader.h"

namespace po = boost::program_options;

namespace kvsim::cli {

namespace {

constexpr const char* kMethods = "foresight, sigmoid_gate, distillcache, rlkv";

std::vector<int> parse_hidden(const std::string& s) {
  std::vector<int> out;
  for (const auto& part : split(s, ',')) {
    try {
      std::size_t used = 0;
      const int v = std::stoi(part, &used);
      if (used != part.size() || v < 1) throw std::invalid_argument(part);
      out.push_back(v);
    } catch (const std::exception&) {
      throw Error("--hidden: '" + part + "' is not a positive layer size (expected e.g. 32,32)");
    }
  }
  if (out.empty()) throw Error("--hidden: expected at least one hidden layer size (e.g. 32,32)");
  return out;
}

}  // namespace

int train_command(const Args& args) {
  std::string method, out, mode = "query-aware", requests, hidden = "32,32", activation = "tanh", import;
  std::vector<std::string> traces;
  train::ForesightOptions fo;
  train::RlkvOptions ro;
  train::SigmoidGateOptions so;
  train::DistillCacheOptions dco;
  std::string train_budgets = "0.1,0.25,0.5";
  std::string semantics = "point";
  std::int64_t reapply_every = BudgetRule{}.every;
  std::int64_t rows = 8;
  train::StreamingWindow window;
  po::options_description desc(
      "kvsim train: fit a learned KV-cache policy to captured traces and write its model file (HDF5), which the\n"
      "policy of the same name reads (e.g. --policies foresight:model=MODEL.h5). Methods: " + std::string(kMethods) +
      ".\n  foresight: a per-token scorer over the token features (docs/learned.md), pairwise hinge loss against\n"
      "  oracle_golden's golden eviction label (ForesightKV's supervised stage)\n"
      "  sigmoid_gate: per-token gates sigmoid(MLP(features)) trained soft (log g added to the attention logits,\n"
      "  attention-output error + a capacity penalty), deployed hard; reports the soft-to-hard gap\n"
      "  distillcache: REINFORCE over Plackett-Luce evictions from a token scorer, reward -KL(full || compressed)\n"
      "  per (request, budget) episode: the trace's offline estimate (--reward trace) or the live model (--reward live)\n"
      "  rlkv: one gate per (layer, KV head), whole cache vs sinks + recent, fitted to each head's streaming error\n"
      "  with a sparsity term; or --import RLKV's adapter_weights.tsv (the trace gives the model geometry)");
  desc.add_options()("help,h", "show this help")("method", po::value(&method), "training method")(
      "trace", po::value(&traces)->multitoken(), "trace files to learn from")(
      "out,o", po::value(&out)->required(), "model file to write (HDF5)")(
      "mode", po::value(&mode)->default_value(mode), "compression point: query-aware | query-agnostic")(
      "requests", po::value(&requests), "comma-separated request ids to train on (default: every complete request)")(
      "hidden", po::value(&hidden)->default_value(hidden), "hidden layer sizes")(
      "activation", po::value(&activation)->default_value(activation), "hidden activation: tanh | relu")(
      "steps", po::value(&fo.steps)->default_value(fo.steps), "Adam steps")(
      "lr", po::value(&fo.lr)->default_value(fo.lr), "Adam learning rate")(
      "heads-per-step", po::value(&fo.heads_per_step)->default_value(fo.heads_per_step),
      "(request, layer, KV head) samples per step")(
      "pairs", po::value(&fo.pairs_per_head)->default_value(fo.pairs_per_head), "token pairs per head sample")(
      "margin", po::value(&fo.margin)->default_value(fo.margin), "hinge margin")(
      "top-share", po::value(&fo.top_share)->default_value(fo.top_share),
      "the better token of each pair is drawn from this top share by golden label")(
      "seed", po::value(&fo.seed)->default_value(fo.seed), "random seed (same seed, same machine: same model)")(
      "capacity", po::value(&so.capacity)->default_value(so.capacity),
      "sigmoid_gate: the mean gate allowed without penalty")(
      "penalty", po::value(&so.penalty)->default_value(so.penalty), "sigmoid_gate: weight of the capacity penalty")(
      "rows", po::value(&rows)->default_value(rows),
      "sigmoid_gate: evaluation rows per query head kept for the loss (evenly spaced)")(
      "episodes", po::value(&dco.episodes)->default_value(dco.episodes), "distillcache: (request, budget) episodes")(
      "samples", po::value(&dco.samples)->default_value(dco.samples),
      "distillcache: sampled evictions per episode (each one's baseline is the others' mean reward)")(
      "temperature", po::value(&dco.temperature)->default_value(dco.temperature), "distillcache: Plackett-Luce temperature")(
      "budgets", po::value(&train_budgets)->default_value(train_budgets), "distillcache: budgets the episodes draw from")(
      "reward", po::value(&dco.reward)->default_value(dco.reward), "distillcache: trace | live")(
      "estimator", po::value(&dco.estimator), "distillcache: kvsim calibrate file weighting the trace reward's layers")(
      "init", po::value(&dco.init), "distillcache: start from this foresight or distillcache model")(
      "model,m", po::value(&dco.model),
      "distillcache --reward live, sigmoid_gate's live soft-to-hard gap: the GGUF model the traces were captured from")(
      "tasks,t", po::value(&dco.tasks), "with --model: the task file of the traces' requests")(
      "max-new", po::value(&dco.max_new)->default_value(dco.max_new), "with --model: continuation length")(
      "budget-semantics", po::value(&semantics)->default_value(semantics),
      "distillcache: point (actions at the compression point) | peak (also at every decode step where the rule "
      "re-applies to hold the budget, as sweep --budget-semantics peak)")(
      "reapply-every", po::value(&reapply_every)->default_value(reapply_every),
      "distillcache, peak: the re-application cadence in tokens, as sweep --reapply-every")(
      "sparsity", po::value(&ro.sparsity)->default_value(ro.sparsity),
      "rlkv: a head keeps its whole cache when its streaming error exceeds this x the mean error")(
      "requests-per-step", po::value(&ro.requests_per_step)->default_value(ro.requests_per_step),
      "rlkv: requests per Adam step")(
      "sinks", po::value(&window.sinks)->default_value(window.sinks), "rlkv: the streaming window's sink tokens")(
      "recent", po::value(&window.recent)->default_value(window.recent), "rlkv: the streaming window's recent tokens")(
      "import", po::value(&import), "rlkv: import RLKV's adapter_weights.tsv instead of training")(
      "force", "replace an existing --out file");
  po::positional_options_description pos;
  pos.add("method", 1).add("trace", -1);
  po::variables_map vm;
  if (!parse_options(args, desc, pos, vm, "kvsim train METHOD TRACE... -o MODEL.h5 [options]")) return 0;
  if (method.empty()) throw Error(std::string("no training method given; expected one of: ") + kMethods);
  if (method != "foresight" && method != "rlkv" && method != "sigmoid_gate" && method != "distillcache")
    throw Error("unknown training method '" + method + "'; expected one of: " + kMethods);
  if (traces.empty()) throw Error("no trace files given (kvsim train " + method + " TRACE... -o MODEL.h5)");
  if (!vm.count("force") && std::filesystem::exists(out))
    throw Error(out + ": file exists; refusing to overwrite it (pass --force to replace)");
  if (!import.empty() && method != "rlkv") throw Error("--import reads RLKV's gate files: kvsim train rlkv --import FILE");
  // Refuse what cannot work before any training time is spent.
  const std::filesystem::path folder = std::filesystem::path(out).parent_path().empty() ? "." : std::filesystem::path(out).parent_path();
  if (!std::filesystem::is_directory(folder) || ::access(folder.c_str(), W_OK) != 0)
    throw Error(out + ": folder '" + folder.string() + "' does not exist or is not writable");
  if (window.sinks < 0 || window.recent < 0)
    throw Error("--sinks and --recent: got " + std::to_string(window.sinks) + " and " + std::to_string(window.recent) +
                "; expected >= 0");
  if (!(fo.margin > 0)) throw Error("--margin: got " + std::to_string(fo.margin) + "; expected > 0");
  if (dco.max_new < 1) throw Error("--max-new: got " + std::to_string(dco.max_new) + "; expected >= 1");
  const bool tty = ::isatty(2) != 0;

  learned::LearnedModel m;
  if (!import.empty()) {
    m = train::import_rlkv_tsv(import, TraceReader(traces.front()).geometry(), traces.front());
  } else {
    train::TrainingInputs in;
    in.traces = traces;
    in.mode = parse_mode(mode);
    in.samples.window = window;
    if (!requests.empty()) in.requests = split(requests, ',');
    if (method == "sigmoid_gate") {
      if (rows < 1) throw Error("--rows must be >= 1");
      in.samples.output_rows = rows;
    }
    const train::TrainingSet set = train::load_training_set(in, std::cerr);
    std::cerr << "train: " << set.requests << " requests, " << set.heads.size() << " (layer, KV head) samples\n";
    if (method == "foresight") {
      fo.hidden = parse_hidden(hidden);
      fo.activation = learned::parse_activation(activation, "--activation");
      fo.tty = tty;
      m = train::train_foresight(set, fo, std::cerr);
    } else if (method == "distillcache") {
      dco.hidden = parse_hidden(hidden);
      dco.activation = learned::parse_activation(activation, "--activation");
      dco.budgets = parse_budgets(train_budgets);
      dco.rule = parse_budget_rule(semantics, reapply_every);
      dco.lr = fo.lr;
      dco.seed = fo.seed;
      dco.tty = tty;
      m = train::train_distillcache(set, in, dco, std::cerr);
    } else if (method == "sigmoid_gate") {
      so.hidden = parse_hidden(hidden);
      so.activation = learned::parse_activation(activation, "--activation");
      so.steps = fo.steps;
      so.lr = fo.lr;
      so.heads_per_step = fo.heads_per_step;
      so.seed = fo.seed;
      so.tty = tty;
      so.model = dco.model;
      so.tasks = dco.tasks;
      so.max_new = dco.max_new;
      m = train::train_sigmoid_gate(set, in, so, std::cerr);
    } else {
      ro.steps = vm["steps"].defaulted() ? ro.steps : fo.steps;
      ro.lr = vm["lr"].defaulted() ? ro.lr : fo.lr;
      ro.seed = fo.seed;
      ro.tty = tty;
      m = train::train_rlkv(set, ro, std::cerr);
      nlohmann::json h = nlohmann::json::parse(m.provenance.hyperparameters);
      h["sinks"] = window.sinks;
      h["recent"] = window.recent;
      h["mode"] = mode_name(in.mode);
      m.provenance.hyperparameters = h.dump();
    }
  }
  learned::write_learned_model(m, out);
  std::printf("%s: %s model, %zu %s, %s; use it as --policies %s:model=%s\n", out.c_str(), m.method.c_str(),
              m.has_network() ? m.network.params().size() : m.head_gates.size(),
              m.has_network() ? "parameters" : "head gates",
              import.empty() ? ("trained on " + std::to_string(m.provenance.requests.size()) + " requests").c_str()
                             : ("imported from " + import).c_str(),
              m.method.c_str(), out.c_str());
  return 0;
}

}  // namespace kvsim::cli
