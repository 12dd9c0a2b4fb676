// Each result file kind through its owner (results/): written, read back equal; a file of an
// older schema read as documented (docs/result-files.md); one of a newer schema refused by name.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>

#include "core/error.h"
#include "results/agreement_file.h"
#include "results/deviation_file.h"
#include "results/detail_file.h"
#include "results/keep_sets_file.h"
#include "results/serve_file.h"
#include "results/sweep_file.h"
#include "results/verify_file.h"
#include "trace_fixtures.h"

using namespace kvsim;
using namespace kvsim::results;
using Catch::Contains;

namespace {

void write(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

SweepConfig sample_sweep_config() {
  SweepConfig c;
  c.tool = "kvsim sweep test";
  c.traces = {"a.h5", "b, \"quoted\".h5"};
  c.mode = "query-aware";
  c.compress_every = 128;
  c.budget_semantics = "peak/64";
  c.estimator = "est.json";
  c.budgets = {0.1, 0.25};
  c.configs = {{"full", 1.0}, {"snapkv:window=8", 0.1}, {"snapkv:window=8", 0.25}};
  return c;
}

SweepRow sample_sweep_row(int k) {
  SweepRow r;
  r.trace = "b, \"quoted\".h5", r.request = "r" + std::to_string(k), r.mode = "query-aware";
  r.policy = "snapkv", r.params = "window=8,pool=max", r.budget = 0.25;
  r.budget_tokens = 37 + k, r.kept_fraction = 0.2512345678, r.mean_recall = 0.9, r.mean_kl = 1.5e-5 * k;
  r.p95_kl = 3e-4, r.mean_out_err = 0.125, r.p95_out_err = 0.5, r.compressed_bytes = 123456;
  r.budget_bytes = 130000, r.peak_bytes = 140000, r.final_bytes = 120000, r.footprint_byte_steps = 9.5e9;
  r.host_bytes = 0, r.eval_queries = 16, r.rows = 3, r.keep_hash = 18446744073709551615ull;
  r.position_fallback = 0, r.budget_semantics = "peak/64", r.decode_peak_bytes = 150000, r.mean_out_sq = 0.02;
  if (k % 2) r.est_kl = 0.0123;
  return r;
}

void check_equal(const SweepRow& a, const SweepRow& b) {
  CHECK(sweep_row_line(a) == sweep_row_line(b));
  CHECK(a.trace == b.trace);
  CHECK(a.keep_hash == b.keep_hash);
  CHECK(a.est_kl == b.est_kl);
  CHECK(a.mean_kl == Approx(b.mean_kl));
}

}  // namespace

TEST_CASE("a sweep file is read back as written", "[results]") {
  const std::string path = test::scratch_file("rt_sweep.csv");
  const SweepConfig config = sample_sweep_config();
  std::string text = sweep_file_head(config);
  for (int k = 0; k < 3; ++k) text += sweep_row_line(sample_sweep_row(k)) + "\n";
  write(path, text);
  const SweepFile f = read_sweep_file(path);
  REQUIRE(f.config);
  CHECK(f.has_banner);
  CHECK(f.config->schema == kSweepSchema);
  CHECK(sweep_config_text(*f.config) == sweep_config_text(config));
  CHECK(f.config_text == sweep_config_text(config));
  CHECK(f.config->configs == config.configs);
  REQUIRE(f.rows.size() == 3);
  for (int k = 0; k < 3; ++k) {
    check_equal(f.rows[static_cast<std::size_t>(k)], sample_sweep_row(k));
    CHECK(f.lines[static_cast<std::size_t>(k)] == sweep_row_line(sample_sweep_row(k)));
  }
  CHECK(f.rows[2].line == 6);
}

TEST_CASE("a sweep file cut by a kill: refused by readers, its tail dropped for --resume", "[results]") {
  const std::string path = test::scratch_file("cut_sweep.csv");
  write(path, sweep_file_head(sample_sweep_config()) + sweep_row_line(sample_sweep_row(0)) + "\n" +
                  sweep_row_line(sample_sweep_row(1)).substr(0, 30));
  CHECK_THROWS_WITH(read_sweep_file(path), Contains("cut_sweep.csv") && Contains("cut short"));
  CHECK(read_sweep_file(path, TornTail::Drop).rows.size() == 1);
}

TEST_CASE("a schema-1 sweep file (before numbers and later columns) is read as documented", "[results]") {
  // As kvsim wrote it before schema numbers: no "schema", prefill_chunk for compress_every, and
  // without the columns added later (budget_semantics, decode_peak_bytes, mean_out_sq, est_kl).
  const std::string path = test::scratch_file("v1_sweep.csv");
  write(path,
        "# kvsim sweep results: one row per trace x request x policy x budget\n"
        "# config: {\"budgets\":[0.5],\"configs\":[{\"budget\":0.5,\"policy\":\"h2o\"}],\"mode\":\"query-aware\","
        "\"prefill_chunk\":64,\"tool\":\"kvsim sweep 0.1\",\"traces\":[\"t.h5\"]}\n"
        "trace,request,mode,policy,params,budget,budget_tokens,kept_fraction,mean_recall,mean_kl,p95_kl,"
        "mean_out_err,p95_out_err,compressed_bytes,budget_bytes,peak_bytes,final_bytes,footprint_byte_steps,"
        "host_bytes,eval_queries,rows,keep_hash,position_fallback\n"
        "t.h5,r0,query-aware,h2o,,0.5,10,0.5,0.8,0.01,0.02,0.1,0.2,100,100,100,100,1000,0,4,1,42,0\n");
  const SweepFile f = read_sweep_file(path);
  REQUIRE(f.config);
  CHECK(f.config->schema == 1);
  CHECK(f.config->compress_every == 64);
  CHECK(f.config->budget_semantics == "point");
  REQUIRE(f.rows.size() == 1);
  CHECK(f.rows[0].mean_kl == 0.01);
  CHECK(f.rows[0].budget_semantics.empty());
  CHECK(std::isnan(f.rows[0].mean_out_sq));
  CHECK(!f.rows[0].est_kl);
}

TEST_CASE("a sweep or detail file of a newer schema is refused, naming both numbers", "[results]") {
  SweepConfig newer = sample_sweep_config();
  newer.schema = kSweepSchema + 1;
  const std::string csv = test::scratch_file("new_sweep.csv");
  write(csv, sweep_file_head(newer));
  CHECK_THROWS_WITH(read_sweep_file(csv), Contains("new_sweep.csv:2") && Contains("schema 3") &&
                                              Contains("reads schema 1 to 2") && Contains("newer kvsim"));
  const std::string detail = test::scratch_file("new_detail.jsonl");
  write(detail, detail_file_head(newer));
  CHECK_THROWS_WITH(read_detail_file(detail), Contains("new_detail.jsonl:1") && Contains("schema 3"));
}

TEST_CASE("a sweep file with a damaged number or column is refused by line and column", "[results]") {
  const std::string path = test::scratch_file("bad_sweep.csv");
  std::string row = sweep_row_line(sample_sweep_row(0));
  row.replace(row.find(",37,"), 4, ",3x7,");
  write(path, sweep_file_head(sample_sweep_config()) + row + "\n");
  CHECK_THROWS_WITH(read_sweep_file(path), Contains("bad_sweep.csv:4") && Contains("'budget_tokens'"));
  write(path, "trace,request,trace\n");
  CHECK_THROWS_WITH(read_sweep_file(path), Contains("bad_sweep.csv:1") && Contains("appears twice"));
}

TEST_CASE("a detail file is read back as written", "[results]") {
  const std::string path = test::scratch_file("rt_detail.jsonl");
  const DetailRow row{
      "t.h5",       "r0",       "snapkv:window=8",       0.25, {0.9, 0.8}, {0.01, 0.02}, {0.1, 0.2}, {0.3, 0.4},
      {0.05, 0.06}, {0.5, 0.6}, {{0.1, 0.2}, {0.3, 0.4}}};
  write(path, detail_file_head(sample_sweep_config()) + detail_row_line(row) + "\n");
  const DetailFile f = read_detail_file(path);
  CHECK(f.config_text == sweep_config_text(sample_sweep_config()));
  REQUIRE(f.rows.size() == 1);
  CHECK(detail_row_line(f.rows[0]) == detail_row_line(row));
  CHECK(f.rows[0].head_kl == row.head_kl);
  CHECK(f.rows[0].line == 2);
  // A schema-1 detail row without the later fields reads with them empty.
  write(path, sweep_config_text(sample_sweep_config()) + "\n" +
                  "{\"trace\":\"t\",\"request\":\"r\",\"policy\":\"h2o\",\"budget\":0.5,\"layer_kl\":[1],"
                  "\"layer_out_err\":[2]}\n");
  CHECK(read_detail_file(path).rows.at(0).layer_out_sq.empty());
  write(path, sweep_config_text(sample_sweep_config()) + "\n{\"trace\":\"t\",\"request\":\"r\",\"budget\":0.5}\n");
  CHECK_THROWS_WITH(read_detail_file(path), Contains("rt_detail.jsonl:2") && Contains("'policy'"));
}

TEST_CASE("a verify file is read back as written, multi-line text included", "[results]") {
  const std::string path = test::scratch_file("rt_verify.csv");
  VerifyConfig c;
  c.model = "m.gguf", c.tasks = "t.jsonl", c.mode = "query-aware", c.max_new = 16, c.weights = "q4_1";
  c.queries = "eval", c.device = "cpu", c.policy_steps = "host", c.budget_semantics = "peak/32";
  VerifyRow r;
  r.request = "r0", r.task = "needle", r.mode = "query-aware", r.policy = "snapkv", r.params = "window=8";
  r.budget = 0.3, r.budget_tokens = 40, r.kept_fraction = 0.3, r.compressed_bytes = 1000, r.budget_bytes = 1100;
  r.steps = 16, r.live_kl = 0.05, r.max_kl = 0.5, r.top1 = 0.9375, r.ppl = 3.5, r.reference_ppl = 3.25;
  r.task_score = 1, r.reference_task_score = 1, r.same_tokens = true, r.seconds = 0.75, r.policy_steps = "host";
  r.position_fallback = 0, r.budget_semantics = "peak/32", r.decode_peak_bytes = 1200;
  r.generated = "two\nlines, \"quoted\"";
  write(path, verify_file_head(c) + verify_row_line(r) + "\n");
  CHECK(is_verify_file(path));
  const VerifyFile f = read_verify_file(path);
  REQUIRE(f.config);
  CHECK(f.config->schema == kVerifySchema);
  CHECK(f.config->budget_semantics == "peak/32");
  CHECK(f.config->max_new == 16);
  REQUIRE(f.rows.size() == 1);
  CHECK(verify_row_line(f.rows[0]) == verify_row_line(r));
  CHECK(f.rows[0].generated == r.generated);

  std::string head = verify_file_head(c);
  head.replace(head.find("\"max_new\":16"), 12, "\"max_new\":1e30");
  write(path, head + verify_row_line(r) + "\n");
  CHECK_THROWS_WITH(read_verify_file(path), Contains("rt_verify.csv:2") && Contains("'max_new'"));
  // Found by fuzz_verify_csv: a budget_tokens of 5e47 was cast to an integer unchecked (undefined).
  // (The record spans lines 4-5: its generated text holds a newline; the error names where it ends.)
  std::string row = verify_row_line(r);
  row.replace(row.find(",40,"), 4, ",5e47,");
  write(path, verify_file_head(c) + row + "\n");
  CHECK_THROWS_WITH(read_verify_file(path),
                    Contains("rt_verify.csv:5") && Contains("'budget_tokens'") && Contains("an integer"));
  c.schema = kVerifySchema + 1;
  write(path, verify_file_head(c) + verify_row_line(r) + "\n");
  CHECK_THROWS_WITH(read_verify_file(path), Contains("rt_verify.csv:2") && Contains("schema 3"));
  // Schema 1: no number in the configuration, fewer columns.
  write(path,
        "# kvsim verify results: one row per request x policy x budget (live, against the full-cache run)\n"
        "# config: {\"tool\":\"kvsim verify\",\"mode\":\"query-aware\"}\n"
        "request,mode,policy,params,budget,live_kl,top1,task_score\nr0,query-aware,h2o,,0.5,0.1,1,1\n");
  const VerifyFile old = read_verify_file(path);
  CHECK(old.config->schema == 1);
  CHECK(old.rows.at(0).budget_semantics.empty());
  CHECK(std::isnan(old.rows.at(0).compressed_bytes));
}

TEST_CASE("an agreement file is read back as written", "[results]") {
  const std::string path = test::scratch_file("rt_agreement.csv");
  AgreementFile a;
  a.configs = 12, a.requests = 4, a.excluded = 2, a.top_k = 3, a.wider_k = 6;
  a.rows.push_back({"mean_kl", 0.9, 0.8, 0.7, 0.2, -0.5, -0.4, 2.0 / 3, 1});
  a.rows.push_back({"est_kl", 0.95, 0.85, 0.75, 0.25, -0.55, -0.45, 1, 1});
  write(path, agreement_file_text(a));
  const AgreementFile b = read_agreement_file(path);
  CHECK(agreement_file_text(b) == agreement_file_text(a));
  CHECK(b.schema == kAgreementSchema);
  CHECK(b.top_k == 3);
  CHECK(b.wider_k == 6);
  CHECK(b.excluded == 2);
  // Schema 1: the banner without a number.
  write(path,
        "# kvsim verify agreement: 12 configs, 4 requests\n"
        "offline_metric,spearman_live_kl,kendall_live_kl,top5_recall,top5_in_top8\nmean_kl,0.9,0.8,1,1\n");
  const AgreementFile old = read_agreement_file(path);
  CHECK(old.schema == 1);
  CHECK(old.rows.at(0).top_recall == 1);
  CHECK(std::isnan(old.rows.at(0).spearman_task));
  write(path, "# kvsim verify agreement (schema 9): 12 configs, 4 requests\n");
  CHECK_THROWS_WITH(read_agreement_file(path), Contains("rt_agreement.csv") && Contains("schema 9"));
}

TEST_CASE("a keep-sets file is read back as written", "[results]") {
  const std::string path = test::scratch_file("rt_keep.json");
  KeepSetsFile k;
  k.trace = "t.h5", k.request = "r0", k.mode = "query-aware", k.tokens = 40, k.compression_point = 32;
  k.layers = 2, k.layer = -1;
  k.configs.push_back({"snapkv", "window=8", "snapkv:window=8", 0.25, {{{0, 1, 5}, {0, 2}}, {{3}, {}}}});
  write(path, keep_sets_text(k));
  const KeepSetsFile b = read_keep_sets_file(path);
  CHECK(keep_sets_text(b) == keep_sets_text(k));
  CHECK(b.configs.at(0).kept == k.configs[0].kept);
  // Schema 1: no number.
  write(path, R"({"trace":"t","request":"r","mode":"m","tokens":4,"compression_point":4,"layers":1,"layer":0,)"
              R"("configs":[{"policy":"h2o","params":"","label":"h2o","budget":0.5,"kept":[[[1,2]]]}]})");
  CHECK(read_keep_sets_file(path).schema == 1);
  // Found by fuzz_result_files: a token index of 2e33 was converted to int unchecked (undefined).
  std::string text = keep_sets_text(k);
  text.replace(text.find("[3]"), 3, "[2222222222222222222222222222222223]");
  write(path, text);
  CHECK_THROWS_WITH(read_keep_sets_file(path), Contains("rt_keep.json") && Contains("'kept'"));
  text = keep_sets_text(k);
  text.replace(text.find("\"tokens\":40"), 11, "\"tokens\":4e40");
  write(path, text);
  CHECK_THROWS_WITH(read_keep_sets_file(path), Contains("field 'tokens'") && Contains("an integer"));
  k.schema = kKeepSetsSchema + 1;
  write(path, keep_sets_text(k));
  CHECK_THROWS_WITH(read_keep_sets_file(path), Contains("rt_keep.json") && Contains("schema 3"));
}

TEST_CASE("serve summaries and grid progress are read back as written", "[results]") {
  nlohmann::json summary = {{"trace", "req.jsonl"},
                            {"reuse_ceiling_blocks", 7},
                            {"reuse_ceiling_tokens", 112},
                            {"results", nlohmann::json::array()}};
  for (int c : {10, 20})
    summary["results"].push_back({{"eviction", "lru"},
                                  {"capacity_blocks", c},
                                  {"requests", 3},
                                  {"block_refs", 9},
                                  {"hit_blocks", 4},
                                  {"block_hit_rate", 4.0 / 9},
                                  {"tokens", 144},
                                  {"hit_tokens", 64},
                                  {"token_hit_rate", 64.0 / 144},
                                  {"evictions", 1}});
  const std::string csv = test::scratch_file("rt_hits.csv"), json = test::scratch_file("rt_hits.json");
  write(csv, serve_csv_text(ServeKind::HitRate, summary));
  write(json, serve_json_text(summary));
  const ServeTable t = read_serve_csv(csv);
  CHECK(t.kind == ServeKind::HitRate);
  CHECK(t.schema == kServeSchema);
  CHECK(t.columns == serve_columns(ServeKind::HitRate));
  REQUIRE(t.rows.size() == 2);
  CHECK(t.rows[1][1] == "20");
  CHECK(t.rows[1].back() == "112");  // the summary's value, repeated on each row
  const nlohmann::json back = read_serve_json(json);
  CHECK(back["results"] == summary["results"]);
  CHECK(back["schema"] == kServeSchema);
  // Schema 1: a CSV without a banner, a summary without a number.
  write(csv,
        serve_csv_text(ServeKind::HitRate, summary).substr(serve_csv_text(ServeKind::HitRate, summary).find('\n') + 1));
  CHECK(read_serve_csv(csv).schema == 1);
  write(json, summary.dump());
  CHECK(read_serve_json(json)["results"].size() == 2);
  nlohmann::json newer = summary;
  newer["schema"] = kServeSchema + 1;
  write(json, newer.dump());
  CHECK_THROWS_WITH(read_serve_json(json), Contains("rt_hits.json") && Contains("schema 3"));

  const nlohmann::json config = {{"trace", "req.jsonl"}, {"hbm", {1, 2}}};
  const std::vector<std::string> lines = {grid_progress_head(config), grid_progress_line(3, summary["results"][0]),
                                          grid_progress_line(0, summary["results"][1])};
  const GridProgress g = parse_grid_progress(lines, "p.progress");
  CHECK(g.config == config);
  REQUIRE(g.rows.size() == 2);
  CHECK(g.rows[0].first == 3);
  CHECK(g.rows[1].second == summary["results"][1]);
  CHECK_THROWS_WITH(parse_grid_progress({lines[0], "{\"point\": -1}"}, "p.progress"),
                    Contains("p.progress: line 2") && Contains("\"point\": N"));
  CHECK_THROWS_WITH(parse_grid_progress({R"({"schema": 9, "config": {}})"}, "p.progress"), Contains("schema 9"));
}

TEST_CASE("a chunk deviation file is read back as written, and refused when it is not one", "[results]") {
  DeviationFile f;
  f.trace = "rag.h5";
  f.rows = {{"alone", 0, 1097, 0.0003, 0.0004, 0.0006, {0, 0, 0, 0}},
            {"other_path", 3, 964, 0.0348, 0.0881, 0.195, {0.304, 0.077, 0.009, 0.003}}};
  const std::string path = test::scratch_file("deviation.csv");
  write(path, deviation_file_text(f));
  const DeviationFile back = read_deviation_file(path);
  CHECK(back.schema == kDeviationSchema);
  CHECK(back.trace == "rag.h5");
  REQUIRE(back.rows.size() == 2);
  CHECK(back.rows[1].comparison == "other_path");
  CHECK(back.rows[1].layer == 3);
  CHECK(back.rows[1].tokens == 964);
  CHECK(back.rows[1].p90 == Approx(0.0881));
  CHECK(back.rows[1].above == std::vector<double>{0.304, 0.077, 0.009, 0.003});
  std::string text = deviation_file_text(f);
  text.replace(text.find("other_path"), 10, "elsewhere");
  write(path, text);
  CHECK_THROWS_WITH(read_deviation_file(path),
                    Contains("column 'comparison' is 'elsewhere', expected alone or other_path"));
  write(path, "# kvsim sweep results\n");
  CHECK_THROWS_WITH(read_deviation_file(path), Contains("expected a kvsim chunk deviation file"));
  f.rows[0].above.pop_back();
  CHECK_THROWS_WITH(deviation_file_text(f), Contains("3 shares, expected 4"));
}
