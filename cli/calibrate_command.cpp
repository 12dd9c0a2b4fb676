// `kvsim calibrate`: fit the offline estimate of live KL to live runs of a calibration split.
#include <boost/program_options.hpp>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "verify/calibrate.h"

namespace po = boost::program_options;

namespace kvsim::cli {

int calibrate_command(const Args& args) {
  std::string offline, detail, live, out;
  double smoothness = 0.1;
  po::options_description desc(
      "kvsim calibrate: fit the offline estimate of live KL (est_kl, docs/estimator.md) to live runs: per-layer\n"
      "weights on the sweep's squared attention-output errors, non-negative and smooth across depth. Give it the\n"
      "sweep and verify results of a calibration split; apply it to other requests with sweep/verify/agreement\n"
      "--estimator (the requests it was fitted on are then left out of the agreement)");
  desc.add_options()("help,h", "show this help")("offline", po::value(&offline)->required(), "sweep result CSV")(
      "detail", po::value(&detail)->required(), "that sweep's --detail JSONL (the per-layer errors)")(
      "live", po::value(&live)->required(), "verify result CSV of the calibration requests (one mode)")(
      "smoothness", po::value(&smoothness)->default_value(smoothness),
      "strength of the second-difference penalty on the layer weights (0: plain non-negative least squares)")(
      "out,o", po::value(&out)->required(), "estimator file to write (JSON)")("force",
                                                                              "replace an existing --out file");
  po::variables_map vm;
  add_output_flags(desc);
  if (!parse_options(args, desc, po::positional_options_description(), vm,
                     "kvsim calibrate --offline S.csv --detail S.jsonl --live V.csv -o estimator.json"))
    return 0;
  refuse_overwrite(out, vm.count("force") > 0);
  std::vector<OfflineRow> rows = read_sweep_csv(offline);
  add_sweep_detail(rows, detail);
  const Estimator e = calibrate_estimator(rows, read_verify_csv(live), smoothness, offline + " / " + detail);
  write_estimator(e, out);
  int used = 0;
  for (double w : e.weights) used += w > 0 ? 1 : 0;
  std::printf(
      "%s: est_kl for %s, fitted on %d live rows (%d configs x %zu requests); %d of %zu layers weighted; "
      "in-sample Spearman with live KL %.3f\n",
      out.c_str(), e.mode.c_str(), e.rows, e.configs, e.requests.size(), used, e.weights.size(), e.fit_spearman);
  std::printf("layer weights:");
  for (std::size_t l = 0; l < e.weights.size(); ++l) std::printf("%s%.3g", l ? " " : " ", e.weights[l]);
  std::printf("\n");
  return 0;
}

}  // namespace kvsim::cli
