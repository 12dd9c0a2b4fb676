// Fuzz target: a sweep result CSV and its detail JSON lines as `kvsim sweep --resume` reads them
// (sim/sweep.*), then as `kvsim sweep merge` reads a one-shard set (sim/sweep_merge.*). The input
// is the CSV, then optionally a line "# --- detail ---" and the detail file. The sweep runs on a
// fixed small synthetic trace whose path does not change, so the configuration line of a seed
// matches and resumption is reached. The seeds are this target's own output: with
// KVSIM_FUZZ_WRITE_SEEDS=DIR it writes a whole result, one without detail and one cut mid-request
// (what a kill leaves), then exits.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "fuzz/fuzz_input.h"
#include "fuzz/small_trace.h"
#include "sim/sweep.h"
#include "sim/sweep_merge.h"

namespace {

constexpr const char* kDetailMarker = "\n# --- detail ---\n";

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void merge_as_one_shard(const std::string& csv, const std::string& detail) {
  kvsim::SweepMergeSpec m;
  m.inputs = {csv};
  m.detail_inputs = {detail};
  m.out_csv = kvsim::fuzz::output_file("merged.csv");
  m.detail_jsonl = kvsim::fuzz::output_file("merged.jsonl");
  (void)kvsim::merge_sweeps(m);
}

kvsim::SweepSpec resume_spec(const std::string& csv, const std::string& detail) {
  kvsim::SweepSpec spec;
  spec.traces = {kvsim::fuzz::small_trace()};
  spec.policies = {"full", "snapkv:window=4", "h2o"};
  spec.budgets = {0.5};
  spec.out_csv = csv;
  spec.detail_jsonl = detail;
  spec.resume = true;
  spec.progress = false;
  return spec;
}

void write_seeds(const std::string& dir) {
  const std::string csv = kvsim::fuzz::output_file("seed.csv"), detail = kvsim::fuzz::output_file("seed.jsonl");
  std::ostringstream progress;
  (void)kvsim::run_sweep(resume_spec(csv, detail), progress);
  const std::string c = read_all(csv), d = read_all(detail);
  std::ofstream(dir + "/whole") << c << (kDetailMarker + 1) << d;
  std::ofstream(dir + "/no_detail") << c;
  std::ofstream(dir + "/killed") << c.substr(0, c.size() - c.size() / 5) << (kDetailMarker + 1)
                                 << d.substr(0, d.size() / 2);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("KVSIM_FUZZ_WRITE_SEEDS")) {
    write_seeds(dir);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const std::size_t cut = input.find(kDetailMarker);
  const std::string csv_text = input.substr(0, cut);
  const std::string csv =
      kvsim::fuzz::input_file(reinterpret_cast<const std::uint8_t*>(csv_text.data()), csv_text.size(), "resume.csv");
  std::string detail = kvsim::fuzz::output_file("resume.jsonl");
  if (cut != std::string::npos) {
    const std::string d = input.substr(cut + std::strlen(kDetailMarker));
    detail = kvsim::fuzz::input_file(reinterpret_cast<const std::uint8_t*>(d.data()), d.size(), "resume.jsonl");
  }
  try {
    merge_as_one_shard(csv, detail);
  } catch (const kvsim::Error&) {
  }
  try {
    std::ostringstream progress;
    (void)kvsim::run_sweep(resume_spec(csv, detail), progress);
    (void)kvsim::summarize_sweep_csv(csv);
  } catch (const kvsim::Error&) {
  }
  return 0;
}
