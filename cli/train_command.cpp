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

struct TrainFlags {
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
  std::int64_t decode_block = 0;
  double label_budget = 0.25;
  train::StreamingWindow window;
};

po::options_description train_options(TrainFlags& f) {
  po::options_description desc(
      "kvsim train: fit a learned KV-cache policy to captured traces and write its model file (HDF5), which the\n"
      "policy of the same name reads (e.g. --policies foresight:model=MODEL.h5). Methods: " +
      std::string(kMethods) +
      ".\n  foresight: a per-token scorer over the token features (docs/learned.md), pairwise hinge loss against\n"
      "  oracle_golden's golden eviction label (ForesightKV's supervised stage)\n"
      "  sigmoid_gate: per-token gates sigmoid(MLP(features)) trained soft (log g added to the attention logits,\n"
      "  attention-output error + a capacity penalty), deployed hard; reports the soft-to-hard gap\n"
      "  distillcache: REINFORCE over Plackett-Luce evictions from a token scorer at every eviction event, reward\n"
      "  -KL_t(full || compressed) at every step t: the trace's calibrated estimate (--reward trace) or the live\n"
      "  model's (--reward live); each action credited with the return from the first step it can change\n"
      "  rlkv: one gate per (layer, KV head), whole cache vs sinks + recent, learned by REINFORCE over sampled head\n"
      "  masks (reward -KL: --reward trace | live) with an L1 sparsity term; or --import RLKV's adapter_weights.tsv\n"
      "  (the trace gives the model geometry)");
  desc.add_options()("help,h", "show this help")("method", po::value(&f.method), "training method")(
      "trace", po::value(&f.traces)->multitoken(), "trace files to learn from")("out,o", po::value(&f.out)->required(),
                                                                                "model file to write (HDF5)")(
      "mode", po::value(&f.mode)->default_value(f.mode), "compression point: query-aware | query-agnostic")(
      "requests", po::value(&f.requests), "comma-separated request ids to train on (default: every complete request)")(
      "hidden", po::value(&f.hidden)->default_value(f.hidden), "hidden layer sizes")(
      "activation", po::value(&f.activation)->default_value(f.activation), "hidden activation: tanh | relu")(
      "steps", po::value(&f.fo.steps)->default_value(f.fo.steps), "Adam steps")(
      "lr", po::value(&f.fo.lr)->default_value(f.fo.lr), "Adam learning rate")(
      "heads-per-step", po::value(&f.fo.heads_per_step)->default_value(f.fo.heads_per_step),
      "(request, layer, KV head) samples per step")(
      "pairs", po::value(&f.fo.pairs_per_head)->default_value(f.fo.pairs_per_head), "token pairs per head sample")(
      "margin", po::value(&f.fo.margin)->default_value(f.fo.margin), "hinge margin")(
      "decode-block", po::value(&f.decode_block)->default_value(0),
      "foresight: label at every decode block of this many tokens too, from the max future attention over the "
      "remaining blocks along the golden policy's own evictions (ForesightKV's supervised stage; needs every decode "
      "query); 0: once, at the compression point")(
      "label-budget", po::value(&f.label_budget)->default_value(0.25),
      "foresight --decode-block: the budget the golden trajectory is held to")(
      "top-share", po::value(&f.fo.top_share)->default_value(f.fo.top_share),
      "the better token of each pair is drawn from this top share by golden label")(
      "seed", po::value(&f.fo.seed)->default_value(f.fo.seed), "random seed (same seed, same machine: same model)")(
      "capacity", po::value(&f.so.capacity)->default_value(f.so.capacity),
      "sigmoid_gate: the mean gate allowed without penalty")(
      "penalty", po::value(&f.so.penalty)->default_value(f.so.penalty), "sigmoid_gate: weight of the capacity penalty")(
      "rows", po::value(&f.rows)->default_value(f.rows),
      "sigmoid_gate: evaluation rows per query head kept for the loss (evenly spaced)")(
      "episodes", po::value(&f.dco.episodes)->default_value(f.dco.episodes),
      "distillcache: (request, budget) episodes")("samples", po::value(&f.dco.samples)->default_value(f.dco.samples),
                                                  "distillcache, rlkv: sampled evictions per episode / head masks per "
                                                  "step (each one's baseline is the others' mean reward)")(
      "temperature", po::value(&f.dco.temperature)->default_value(f.dco.temperature),
      "distillcache: Plackett-Luce temperature")(
      "discount", po::value(&f.dco.discount)->default_value(f.dco.discount),
      "distillcache: per-step discount of the return an action is credited with")(
      "budgets", po::value(&f.train_budgets)->default_value(f.train_budgets),
      "distillcache: budgets the episodes draw from")("reward", po::value(&f.dco.reward)->default_value(f.dco.reward),
                                                      "distillcache, rlkv: trace | live")(
      "estimator", po::value(&f.dco.estimator),
      "distillcache, rlkv: kvsim calibrate file weighting the trace reward's layers")(
      "init", po::value(&f.dco.init), "distillcache: start from this foresight or distillcache model")(
      "model,m", po::value(&f.dco.model),
      "distillcache and rlkv --reward live, sigmoid_gate's live soft-to-hard gap: the GGUF model the traces were "
      "captured from")("tasks,t", po::value(&f.dco.tasks), "with --model: the task file of the traces' requests")(
      "max-new", po::value(&f.dco.max_new)->default_value(f.dco.max_new), "with --model: continuation length")(
      "min-new", po::value(&f.dco.min_new)->default_value(f.dco.min_new),
      "distillcache, rlkv --reward live: no end of generation before this many tokens")(
      "budget-semantics", po::value(&f.semantics)->default_value(f.semantics),
      "distillcache: point (actions at the compression point) | peak (also at every decode step where the rule "
      "re-applies to hold the budget, as sweep --budget-semantics peak)")(
      "reapply-every", po::value(&f.reapply_every)->default_value(f.reapply_every),
      "distillcache, peak: the re-application cadence in tokens, as sweep --reapply-every")(
      "sparsity", po::value(&f.ro.sparsity)->default_value(f.ro.sparsity),
      "rlkv: L1 weight on the gates; a head keeps its whole cache when that saves more KL than this x the mean "
      "head's share of the all-streaming KL")("sinks", po::value(&f.window.sinks)->default_value(f.window.sinks),
                                              "rlkv: the streaming window's sink tokens")(
      "recent", po::value(&f.window.recent)->default_value(f.window.recent),
      "rlkv: the streaming window's recent tokens")("import", po::value(&f.import),
                                                    "rlkv: import RLKV's adapter_weights.tsv instead of training")(
      "force", "replace an existing --out file");
  return desc;
}

// Refuses what cannot work before any training time is spent.
void check_train_flags(const TrainFlags& f, const po::variables_map& vm) {
  if (f.method.empty()) throw Error(std::string("no training method given; expected one of: ") + kMethods);
  if (f.method != "foresight" && f.method != "rlkv" && f.method != "sigmoid_gate" && f.method != "distillcache")
    throw Error("unknown training method '" + f.method + "'; expected one of: " + kMethods);
  if (f.traces.empty()) throw Error("no trace files given (kvsim train " + f.method + " TRACE... -o MODEL.h5)");
  refuse_overwrite(f.out, vm.count("force") > 0);
  if (!f.import.empty() && f.method != "rlkv")
    throw Error("--import reads RLKV's gate files: kvsim train rlkv --import FILE");
  const std::filesystem::path folder =
      std::filesystem::path(f.out).parent_path().empty() ? "." : std::filesystem::path(f.out).parent_path();
  if (!std::filesystem::is_directory(folder) || ::access(folder.c_str(), W_OK) != 0)
    throw Error(f.out + ": folder '" + folder.string() + "' does not exist or is not writable");
  if (f.window.sinks < 0 || f.window.recent < 0)
    throw Error("--sinks and --recent: got " + std::to_string(f.window.sinks) + " and " +
                std::to_string(f.window.recent) + "; expected >= 0");
  if (!(f.fo.margin > 0)) throw Error("--margin: got " + std::to_string(f.fo.margin) + "; expected > 0");
  if (f.dco.max_new < 1) throw Error("--max-new: got " + std::to_string(f.dco.max_new) + "; expected >= 1");
}

// The model: imported (rlkv --import) or trained by the method's trainer.
learned::LearnedModel train_model(TrainFlags& f, const po::variables_map& vm) {
  const bool tty = ::isatty(2) != 0;
  learned::LearnedModel m;
  if (!f.import.empty()) {
    m = train::import_rlkv_tsv(f.import, TraceReader(f.traces.front()).geometry(), f.traces.front());
  } else {
    train::TrainingInputs in;
    in.traces = f.traces;
    in.mode = parse_mode(f.mode);
    in.samples.window = f.window;
    if (f.decode_block < 0) throw Error("--decode-block: got " + std::to_string(f.decode_block) + "; expected >= 0");
    if (f.decode_block > 0) {
      if (f.method != "foresight") throw Error("--decode-block labels foresight's training set: kvsim train foresight");
      in.samples.decode_block = f.decode_block;
      in.samples.trajectory_budget = f.label_budget;
      in.samples.labeler = "oracle_golden:block=" + std::to_string(f.decode_block);
    }
    if (!f.requests.empty()) in.requests = split(f.requests, ',');
    if (f.method == "sigmoid_gate") {
      if (f.rows < 1) throw Error("--rows must be >= 1");
      in.samples.output_rows = f.rows;
    }
    const train::TrainingSet set = train::load_training_set(in, std::cerr);
    std::cerr << "train: " << set.requests << " requests, " << set.heads.size() << " (layer, KV head) samples\n";
    if (f.method == "foresight") {
      f.fo.hidden = parse_hidden(f.hidden);
      f.fo.activation = learned::parse_activation(f.activation, "--activation");
      f.fo.tty = tty;
      m = train::train_foresight(set, f.fo, std::cerr);
    } else if (f.method == "distillcache") {
      f.dco.hidden = parse_hidden(f.hidden);
      f.dco.activation = learned::parse_activation(f.activation, "--activation");
      f.dco.budgets = parse_budgets(f.train_budgets);
      f.dco.rule = parse_budget_rule(f.semantics, f.reapply_every);
      f.dco.lr = f.fo.lr;
      f.dco.seed = f.fo.seed;
      f.dco.tty = tty;
      m = train::train_distillcache(set, in, f.dco, std::cerr);
    } else if (f.method == "sigmoid_gate") {
      f.so.hidden = parse_hidden(f.hidden);
      f.so.activation = learned::parse_activation(f.activation, "--activation");
      f.so.steps = f.fo.steps;
      f.so.lr = f.fo.lr;
      f.so.heads_per_step = f.fo.heads_per_step;
      f.so.seed = f.fo.seed;
      f.so.tty = tty;
      f.so.model = f.dco.model;
      f.so.tasks = f.dco.tasks;
      f.so.max_new = f.dco.max_new;
      m = train::train_sigmoid_gate(set, in, f.so, std::cerr);
    } else {
      f.ro.steps = vm["steps"].defaulted() ? f.ro.steps : f.fo.steps;
      f.ro.lr = vm["lr"].defaulted() ? f.ro.lr : f.fo.lr;
      f.ro.seed = f.fo.seed;
      f.ro.tty = tty;
      f.ro.samples = f.dco.samples;
      f.ro.reward = f.dco.reward;
      f.ro.estimator = f.dco.estimator;
      f.ro.model = f.dco.model;
      f.ro.tasks = f.dco.tasks;
      f.ro.max_new = f.dco.max_new;
      f.ro.min_new = f.dco.min_new;
      m = train::train_rlkv(set, in, f.ro, std::cerr);
    }
  }
  return m;
}

}  // namespace

int train_command(const Args& args) {
  TrainFlags f;
  po::options_description desc = train_options(f);
  po::positional_options_description pos;
  pos.add("method", 1).add("trace", -1);
  po::variables_map vm;
  add_output_flags(desc);
  if (!parse_options(args, desc, pos, vm, "kvsim train METHOD TRACE... -o MODEL.h5 [options]")) return 0;
  check_train_flags(f, vm);
  const learned::LearnedModel m = train_model(f, vm);
  learned::write_learned_model(m, f.out);
  std::printf("%s: %s model, %zu %s, %s; use it as --policies %s:model=%s\n", f.out.c_str(), m.method.c_str(),
              m.has_network() ? m.network.params().size() : m.head_gates.size(),
              m.has_network() ? "parameters" : "head gates",
              f.import.empty() ? ("trained on " + std::to_string(m.provenance.requests.size()) + " requests").c_str()
                               : ("imported from " + f.import).c_str(),
              m.method.c_str(), f.out.c_str());
  return 0;
}

}  // namespace kvsim::cli
