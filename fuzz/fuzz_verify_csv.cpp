// Fuzz target: `kvsim verify` result files (CSV, verify/live_results.h), then what `kvsim
// agreement` does with one: the offline ranking of a fixed sweep of the small synthetic trace
// compared with it. Seeds: result files in verify's format over that sweep's configs, one of
// another budget semantics, one with quoted multi-line generated text.
#include <cstdint>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "fuzz/fuzz_input.h"
#include "fuzz/seed_writer.h"
#include "fuzz/small_trace.h"
#include "fuzz/quiet_sweep.h"
#include "results/verify_file.h"
#include "sim/sweep.h"
#include "verify/agreement.h"
#include "verify/live_results.h"
#include "verify/sweep_results.h"

namespace {

const std::vector<kvsim::OfflineRow>& offline_rows() {
  static const std::vector<kvsim::OfflineRow> rows = [] {
    const kvsim::SweepSpec spec = kvsim::fuzz::quiet_sweep(
        {kvsim::fuzz::small_trace()}, {"snapkv", "h2o", "streamingllm", "tova"}, {0.3, 0.6}, "verify_csv_sweep.csv");
    kvsim::fuzz::run_quiet(spec);
    return kvsim::read_sweep_csv(spec.out_csv);
  }();
  return rows;
}

// A verify file written by its owner (results/verify_file.h), as `kvsim verify` writes one.
void write_seed(const std::string& path, const std::string& semantics, const std::string& generated) {
  std::ofstream out(path);
  kvsim::results::VerifyConfig config;
  config.mode = "query-aware";
  config.budget_semantics = semantics;
  out << kvsim::results::verify_file_head(config);
  int n = 0;
  for (const kvsim::OfflineRow& r : offline_rows()) {
    kvsim::results::VerifyRow v;
    v.request = r.request, v.task = "needle", v.mode = "query-aware", v.policy = r.policy, v.params = r.params;
    v.budget = r.budget, v.live_kl = 0.01 * ++n, v.top1 = n % 3 ? 1 : 0.5, v.task_score = n % 2;
    v.budget_semantics = semantics, v.generated = generated;
    out << kvsim::results::verify_row_line(v) << "\n";
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  return kvsim::fuzz::seeds_then_exit([](const std::string& dir) {
    write_seed(dir + "/point.csv", "point", "the answer");
    write_seed(dir + "/peak.csv", "peak/64", "two\nlines, \"quoted\"");
  });
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = kvsim::fuzz::input_file(data, size, "verify.csv");
  try {
    const kvsim::LiveResults live = kvsim::read_verify_csv(path);
    const kvsim::AgreementReport report =
        kvsim::agreement(offline_rows(), live.rows, kvsim::offline_metric_names(false), 2, {}, 3);
    std::ostringstream os;
    kvsim::print_agreement(report, os);
  } catch (const kvsim::Error&) {
  }
  return 0;
}
