// `kvsim agreement`: the agreement report from result files already written (no live runs).
#include <boost/program_options.hpp>
#include <filesystem>
#include <iostream>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "verify/calibrate.h"

namespace po = boost::program_options;

namespace kvsim::cli {

int agreement_command(const Args& args) {
  std::string offline, detail, estimator, out;
  std::vector<std::string> live;
  int top = 5, wider = 8;
  po::options_description desc(
      "kvsim agreement: how well a sweep's offline metrics rank (policy, budget) configs the way verify's live runs\n"
      "do, from their result files. With --estimator, its est_kl joins the metrics and the requests it was fitted\n"
      "on are left out");
  desc.add_options()("help,h", "show this help")("offline", po::value(&offline)->required(), "sweep result CSV")(
      "detail", po::value(&detail), "that sweep's --detail JSONL (per-layer metrics; needed by --estimator)")(
      "live", po::value(&live)->required()->multitoken(), "verify result CSV(s) of one mode")(
      "estimator", po::value(&estimator), "a `kvsim calibrate` file")("top", po::value(&top)->default_value(top),
                                                                      "k of the top-k recall")(
      "wider", po::value(&wider)->default_value(wider),
      "the live top-k is also sought in the offline top of this many")(
      "out,o", po::value(&out), "write the agreement table as CSV too")("force", "replace an existing --out file");
  po::variables_map vm;
  add_output_flags(desc);
  if (!parse_options(args, desc, po::positional_options_description(), vm,
                     "kvsim agreement --offline S.csv [--detail S.jsonl] --live V.csv [--estimator E.json] [-o A.csv]"))
    return 0;
  if (top < 1 || wider < top) throw Error("--top must be >= 1 and --wider >= --top");
  refuse_overwrite(out, vm.count("force") > 0);
  std::vector<OfflineRow> rows = read_sweep_csv(offline);
  if (!detail.empty()) add_sweep_detail(rows, detail);
  const std::vector<std::string> fitted_on = apply_estimator_file(rows, estimator, detail);
  std::vector<LiveRow> live_rows;
  std::string mode, semantics;
  for (const auto& path : live) {
    LiveResults r = read_verify_csv(path);
    if (!mode.empty() && r.mode != mode) throw Error(path + ": mode " + r.mode + ", the other live files' is " + mode);
    mode = r.mode;
    if (!semantics.empty() && !r.semantics.empty() && r.semantics != semantics)
      throw Error(path + ": budget_semantics " + r.semantics + ", the other live files' is " + semantics);
    if (semantics.empty()) semantics = r.semantics;
    live_rows.insert(live_rows.end(), r.rows.begin(), r.rows.end());
  }
  for (const auto& r : rows)
    if (r.mode != mode) throw Error(offline + ": the sweep ran " + r.mode + ", the live runs " + mode);
  for (const auto& r : rows) require_same_semantics(r.semantics, semantics, offline);
  const AgreementReport rep = agreement(rows, live_rows, offline_metric_names(!detail.empty()), top, fitted_on, wider);
  print_agreement(rep, std::cout);
  if (!out.empty()) write_agreement_csv(rep, out);
  return 0;
}

}  // namespace kvsim::cli
