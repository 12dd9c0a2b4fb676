// kvsim sweep as a whole: config expansion, bad input, resumption after a kill.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <iostream>
#include <sstream>

#include "core/error.h"
#include "sim/sweep.h"
#include "sim/sweep_merge.h"
#include "trace_fixtures.h"

using namespace kvsim;

namespace {

SweepSpec small_spec(const std::string& out) {
  SweepSpec spec;
  spec.traces = {test::write_small_trace("sweep.h5")};
  spec.policies = {"full", "snapkv:window=8", "h2o", "oracle_future"};
  spec.budgets = {0.2, 0.5};
  spec.out_csv = test::scratch_file(out);
  spec.progress = false;
  spec.force = true;
  return spec;
}

std::vector<std::string> data_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);)
    if (!l.empty() && l[0] != '#' && l.rfind("trace,", 0) != 0) out.push_back(l);
  return out;
}

}  // namespace

TEST_CASE("a sweep writes one row per request x config and a ranked summary", "[sweep]") {
  const SweepSpec spec = small_spec("basic.csv");
  const auto summary = run_sweep(spec, std::cerr);
  // full once + 3 policies x 2 budgets = 7 configs, 3 requests.
  CHECK(data_lines(spec.out_csv).size() == 21);
  REQUIRE(summary.size() == 7);
  CHECK(summary.back().label == "full");
  std::ifstream in(spec.out_csv);
  std::string first, second;
  std::getline(in, first);
  std::getline(in, second);
  CHECK(first.rfind("# kvsim sweep", 0) == 0);
  CHECK(second.rfind("# config: {", 0) == 0);
  CHECK(second.find("\"snapkv:window=8,kernel=5,pool=avg,gqa=mean\"") != std::string::npos);
  for (std::size_t i = 1; i < summary.size(); ++i)
    if (summary[i].budget == summary[i - 1].budget) CHECK(summary[i].mean_kl >= summary[i - 1].mean_kl);
}

TEST_CASE("a killed sweep resumes without losing or repeating rows", "[sweep]") {
  SweepSpec spec = small_spec("resume.csv");
  spec.detail_jsonl = test::scratch_file("resume.jsonl");
  run_sweep(spec, std::cerr);
  const auto complete = data_lines(spec.out_csv);
  auto detail_lines = [&] {
    std::ifstream in(spec.detail_jsonl);
    std::vector<std::string> out;
    for (std::string l; std::getline(in, l);) out.push_back(l);
    std::sort(out.begin() + 1, out.end());
    return out;
  };
  const auto complete_detail = detail_lines();
  REQUIRE(complete_detail.size() == 1 + 21);
  // Simulate a kill: keep the header, the first request's rows and half a row of the second.
  std::ifstream in(spec.out_csv);
  std::ostringstream cut;
  int data = 0;
  for (std::string l; std::getline(in, l);) {
    const bool is_data = !l.empty() && l[0] != '#' && l.rfind("trace,", 0) != 0;
    if (is_data && ++data > 8) break;
    cut << l << "\n";
  }
  // A torn row that lost only the end of its last field (it still has every column).
  cut << complete[8].substr(0, complete[8].size() - 3);
  in.close();
  std::ofstream(spec.out_csv, std::ios::trunc) << cut.str();
  // The detail file lost its tail too: keep the header, 9 lines and half a line.
  {
    std::ifstream din(spec.detail_jsonl);
    std::ostringstream dcut;
    std::string l;
    for (int i = 0; i < 10 && std::getline(din, l); ++i) dcut << l << "\n";
    std::getline(din, l);
    dcut << l.substr(0, l.size() / 2);
    din.close();
    std::ofstream(spec.detail_jsonl, std::ios::trunc) << dcut.str();
  }
  spec.force = false;
  spec.resume = true;
  run_sweep(spec, std::cerr);
  CHECK(data_lines(spec.out_csv) == complete);
  CHECK(detail_lines() == complete_detail);

  // Resuming with another configuration is refused, and the file is left alone.
  spec.budgets = {0.3};
  CHECK_THROWS_WITH(run_sweep(spec, std::cerr), Catch::Contains("--resume with a different configuration"));
  CHECK(data_lines(spec.out_csv) == complete);
  spec.resume = false;
  CHECK_THROWS_WITH(run_sweep(spec, std::cerr), Catch::Contains("exists; pass --resume"));
}

// Found by fuzz_sweep_resume: --resume counted any row with every column as finished, and the
// summary then met a bare std::stod on a damaged number (std::invalid_argument, no file named).
TEST_CASE("a resumed result file with a damaged whole row is refused naming line and column", "[sweep]") {
  SweepSpec spec = small_spec("damaged.csv");
  run_sweep(spec, std::cerr);
  std::ifstream in(spec.out_csv);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  in.close();
  REQUIRE(lines.size() > 6);
  auto damaged = lines;
  const std::size_t at = damaged[5].find(",0.5,");  // the budget column of a SnapKV row
  REQUIRE(at != std::string::npos);
  damaged[5].replace(at, 5, ",0.5x,");
  std::ostringstream text;
  for (const auto& l : damaged) text << l << "\n";
  std::ofstream(spec.out_csv, std::ios::trunc) << text.str();
  CHECK_THROWS_WITH(summarize_sweep_csv(spec.out_csv),
                    Catch::Contains("damaged.csv:") && Catch::Contains("column 'budget' is '0.5x', expected a number"));
  spec.force = false;
  spec.resume = true;
  CHECK_THROWS_WITH(run_sweep(spec, std::cerr),
                    Catch::Contains("damaged.csv:6: column 'budget' is '0.5x', expected a number"));
  damaged[5] = damaged[5].substr(0, damaged[5].rfind(','));  // a whole line with a column missing
  text.str("");
  for (const auto& l : damaged) text << l << "\n";
  std::ofstream(spec.out_csv, std::ios::trunc) << text.str();
  CHECK_THROWS_WITH(run_sweep(spec, std::cerr),
                    Catch::Contains("damaged.csv:6:") && Catch::Contains("fields, expected 27"));
}

TEST_CASE("bad sweep input is rejected with a clear message", "[sweep]") {
  SweepSpec spec = small_spec("bad.csv");
  spec.policies = {"nope"};
  CHECK_THROWS_WITH(run_sweep(spec, std::cerr), Catch::Contains("unknown policy 'nope'") && Catch::Contains("snapkv"));
  spec.policies = {"h2o:heavy=3"};
  CHECK_THROWS_WITH(run_sweep(spec, std::cerr), Catch::Contains("unknown parameter 'heavy'"));
  spec.policies = {"snapkv"};
  for (double b : {0.0, -0.5, 1.5}) {
    spec.budgets = {b};
    CHECK_THROWS_WITH(run_sweep(spec, std::cerr),
                      Catch::Contains("expected a fraction of the full KV bytes in (0, 1]"));
  }
  spec.budgets = {0.5};

  SynthConfig other = test::small_synth_config();
  other.geometry.n_layers = 3;
  spec.traces.push_back(test::write_small_trace("other_geometry.h5", other));
  CHECK_THROWS_WITH(run_sweep(spec, std::cerr),
                    Catch::Contains("model geometry (3 layers") && Catch::Contains("differs"));

  const std::string empty = test::scratch_file("empty.h5");
  { TraceWriter w(empty, test::small_synth_config().geometry, {}, TraceWriterOptions{true, 0}); }
  spec.traces = {empty};
  CHECK_THROWS_WITH(run_sweep(spec, std::cerr), Catch::Contains("no complete requests"));

  // A policy that needs queries the trace did not record says which.
  SynthConfig sparse = test::small_synth_config();
  sparse.all_queries = false;
  sparse.repeat_pass = false;
  sparse.query_window = 4;
  spec.traces = {test::write_small_trace("sparse_queries.h5", sparse)};
  spec.policies = {"snapkv:window=16"};
  CHECK_THROWS_WITH(run_sweep(spec, std::cerr), Catch::Contains("needs the queries of the last 16 tokens"));
}

namespace {

std::string file_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

TEST_CASE("sharded sweeps merge into the serial sweep's files byte for byte, a killed shard resumed", "[sweep]") {
  // Two traces (3 + 2 requests): shards take requests round-robin across the trace boundary.
  SweepSpec serial = small_spec("serial.csv");
  SynthConfig second = test::small_synth_config(9);
  second.n_requests = 2;
  serial.traces.push_back(test::write_small_trace("sweep_second.h5", second));
  serial.detail_jsonl = test::scratch_file("serial.jsonl");
  run_sweep(serial, std::cerr);
  const int n = 3;
  SweepMergeSpec merge;
  for (int i = 0; i < n; ++i) {
    SweepSpec shard = serial;
    shard.shard = i;
    shard.shards = n;
    shard.out_csv = test::scratch_file("shard" + std::to_string(i) + ".csv");
    shard.detail_jsonl = test::scratch_file("shard" + std::to_string(i) + ".jsonl");
    run_sweep(shard, std::cerr);
    CHECK(data_lines(shard.out_csv).size() == (i < 2 ? 2u : 1u) * 7);  // requests 0,3 | 1,4 | 2
    merge.inputs.insert(merge.inputs.begin(), shard.out_csv);          // any order
    merge.detail_inputs.insert(merge.detail_inputs.begin(), shard.detail_jsonl);
    if (i == 1) {
      // Kill it half-way through its second request, then resume: the merge cannot tell.
      const std::string text = file_text(shard.out_csv);
      std::ofstream(shard.out_csv, std::ios::trunc) << text.substr(0, text.size() - 300);
      CHECK_THROWS_WITH(merge_sweeps({{shard.out_csv}, {}, test::scratch_file("never.csv"), "", true}),
                        Catch::Contains("last line is cut short") && Catch::Contains("--resume"));
      shard.resume = true;
      shard.force = false;
      run_sweep(shard, std::cerr);
    }
  }
  merge.out_csv = test::scratch_file("merged.csv");
  merge.detail_jsonl = test::scratch_file("merged.jsonl");
  merge.force = true;
  const auto summary = merge_sweeps(merge);
  CHECK(file_text(merge.out_csv) == file_text(serial.out_csv));
  CHECK(file_text(merge.detail_jsonl) == file_text(serial.detail_jsonl));
  CHECK(summary.size() == 7);
  CHECK(summary.front().requests == 5);

  // What cannot be merged is refused by name.
  SweepMergeSpec bad = merge;
  bad.detail_inputs.clear();
  bad.detail_jsonl.clear();
  bad.inputs.pop_back();
  CHECK_THROWS_WITH(merge_sweeps(bad), Catch::Contains("shard 0/3 is missing"));
  bad.inputs = {merge.inputs[0], merge.inputs[1], merge.inputs[1]};
  CHECK_THROWS_WITH(merge_sweeps(bad), Catch::Contains("shard 1/3 is also"));
  bad.inputs = {merge.inputs[0], merge.inputs[1], serial.out_csv};
  CHECK_THROWS_WITH(merge_sweeps(bad), Catch::Contains("serial.csv: its configuration has no \"shard\""));
  SweepSpec other = serial;  // shard 0 of another budget list
  other.budgets = {0.3};
  other.shards = n;
  other.detail_jsonl.clear();
  other.out_csv = test::scratch_file("other0.csv");
  run_sweep(other, std::cerr);
  bad.inputs = {other.out_csv, merge.inputs[0], merge.inputs[1]};
  CHECK_THROWS_WITH(merge_sweeps(bad), Catch::Contains("a different sweep configuration"));
  // A shard that stopped cleanly before its last request (its file otherwise intact): shard 1 of
  // requests 0..4 should hold 1 and 4.
  const std::string shard1 = test::scratch_file("shard1.csv"), lost = test::scratch_file("lost1.csv");
  const std::string text = file_text(shard1);
  std::size_t cut = text.size();  // back over its last 7 lines: the final newline, then 7 more
  for (int lines = 0; lines < 8; ++lines) cut = text.rfind('\n', cut - 1);
  std::ofstream(lost, std::ios::trunc) << text.substr(0, cut + 1);
  bad.inputs = {lost, test::scratch_file("shard0.csv"), test::scratch_file("shard2.csv")};
  CHECK_THROWS_WITH(merge_sweeps(bad), Catch::Contains("1 requests, expected 2 for shard 1/3 of 5"));
  bad.inputs = merge.inputs;
  bad.out_csv = merge.inputs[0];
  CHECK_THROWS_WITH(merge_sweeps(bad), Catch::Contains("is one of the inputs"));
}

TEST_CASE("a resumed sweep keeps the order it wrote, past ten requests", "[sweep]") {
  // r0 ... r12: sorted as strings, r10 would come before r2.
  SynthConfig many = test::small_synth_config();
  many.n_requests = 13;
  SweepSpec spec = small_spec("order.csv");
  spec.traces = {test::write_small_trace("order.h5", many)};
  spec.policies = {"snapkv:window=8", "h2o"};
  spec.budgets = {0.5};
  spec.detail_jsonl = test::scratch_file("order.jsonl");
  run_sweep(spec, std::cerr);
  const std::string csv = file_text(spec.out_csv), detail = file_text(spec.detail_jsonl);
  // Killed in request 12: its CSV rows half there; the detail lost request 11's last line too, so
  // request 11 (whole in the CSV) must be redone as well.
  std::ofstream(spec.out_csv, std::ios::trunc) << csv.substr(0, csv.size() - 40);
  std::size_t cut = detail.size();
  for (int lines = 0; lines < 4; ++lines) cut = detail.rfind('\n', cut - 1);
  std::ofstream(spec.detail_jsonl, std::ios::trunc) << detail.substr(0, cut + 1);
  spec.resume = true;
  spec.force = false;
  run_sweep(spec, std::cerr);
  CHECK(file_text(spec.out_csv) == csv);
  CHECK(file_text(spec.detail_jsonl) == detail);
}
