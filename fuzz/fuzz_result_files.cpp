// Fuzz target: the result files kvsim reads back that no other target drives (results/): the
// agreement CSV, the chunk deviation CSV, the keep-sets JSON, the serve CSV and JSON summaries and a serving grid's
// progress file. The input's first byte picks the reader, the rest is the file. Seeds: files
// written by the owners' writers.
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/text_lines.h"
#include "fuzz/fuzz_input.h"
#include "fuzz/seed_writer.h"
#include "results/agreement_file.h"
#include "results/deviation_file.h"
#include "results/keep_sets_file.h"
#include "results/serve_file.h"

namespace {

enum Reader : char {
  Agreement = 'a',
  Deviation = 'd',
  KeepSets = 'k',
  ServeCsv = 'c',
  ServeJson = 'j',
  Progress = 'p'
};

void write_seed(const std::string& path, Reader r, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << static_cast<char>(r) << text;
}

nlohmann::json serve_summary() {
  nlohmann::json s = {{"trace", "req.jsonl"},
                      {"reuse_ceiling_blocks", 7},
                      {"reuse_ceiling_tokens", 112},
                      {"results", nlohmann::json::array()}};
  for (int c : {10, 20})
    s["results"].push_back({{"eviction", "lru"},
                            {"capacity_blocks", c},
                            {"requests", 3},
                            {"block_refs", 9},
                            {"hit_blocks", 4},
                            {"block_hit_rate", 0.44},
                            {"tokens", 144},
                            {"hit_tokens", 64},
                            {"token_hit_rate", 0.44},
                            {"evictions", 1}});
  return s;
}

void write_seeds(const std::string& dir) {
  using namespace kvsim::results;
  AgreementFile a;
  a.configs = 12, a.requests = 4, a.excluded = 1;
  a.rows.push_back({"mean_kl", 0.9, 0.8, 0.7, 0.2, -0.5, -0.4, 0.6, 1});
  write_seed(dir + "/agreement", Agreement, agreement_file_text(a));
  DeviationFile dv;
  dv.trace = "rag.h5";
  dv.rows.push_back({"alone", 2, 40, 0.1, 0.2, 0.3, {0.9, 0.5, 0.1, 0}});
  write_seed(dir + "/deviation", Deviation, deviation_file_text(dv));
  KeepSetsFile k;
  k.trace = "t.h5", k.request = "r0", k.mode = "query-aware", k.tokens = 8, k.compression_point = 8, k.layers = 1;
  k.configs.push_back({"snapkv", "window=8", "snapkv:window=8", 0.5, {{{0, 1, 5}, {2, 3}}}});
  write_seed(dir + "/keep_sets", KeepSets, keep_sets_text(k));
  write_seed(dir + "/serve_csv", ServeCsv, serve_csv_text(ServeKind::HitRate, serve_summary()));
  write_seed(dir + "/serve_json", ServeJson, serve_json_text(serve_summary()));
  write_seed(dir + "/progress", Progress,
             grid_progress_head({{"trace", "req.jsonl"}}) + "\n" +
                 grid_progress_line(1, serve_summary()["results"][0]) + "\n");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) { return kvsim::fuzz::seeds_then_exit(write_seeds); }

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string path = kvsim::fuzz::input_file(data + 1, size - 1, "result");
  try {
    switch (static_cast<char>(data[0])) {
      case Agreement:
        (void)kvsim::results::read_agreement_file(path);
        break;
      case Deviation:
        (void)kvsim::results::read_deviation_file(path);
        break;
      case KeepSets:
        (void)kvsim::results::read_keep_sets_file(path);
        break;
      case ServeCsv:
        (void)kvsim::results::read_serve_csv(path);
        break;
      case ServeJson:
        (void)kvsim::results::read_serve_json(path);
        break;
      case Progress:
        (void)kvsim::results::parse_grid_progress(kvsim::whole_lines(path), path);
        break;
      default:
        break;
    }
  } catch (const kvsim::Error&) {
  }
  return 0;
}
