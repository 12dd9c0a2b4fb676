// train/: training sets from traces, the foresight trainer, and its model run as a policy.
#include <catch2/catch.hpp>
#include <iostream>
#include <sstream>

#include "core/sha256.h"
#include "learned/features.h"
#include "learned/model_file.h"
#include "policies/registry.h"
#include "sim/replay.h"
#include "sim/sweep.h"
#include "trace_fixtures.h"
#include "train/foresight_trainer.h"

using namespace kvsim;

namespace {

SynthConfig training_config(std::uint64_t seed) {
  SynthConfig cfg = test::small_synth_config(seed);
  cfg.n_requests = 5;  // five: the trainer holds the last one out
  return cfg;
}

const std::string& training_trace() {
  static const std::string path = test::write_small_trace("train_a.h5", training_config(7));
  return path;
}

const train::TrainingSet& training_set() {
  static const train::TrainingSet set = [] {
    train::TrainingInputs in;
    in.traces = {training_trace()};
    std::ostringstream quiet;
    return train::load_training_set(in, quiet);
  }();
  return set;
}

train::ForesightOptions quick_options() {
  train::ForesightOptions o;
  o.steps = 120;
  o.hidden = {16};
  o.heads_per_step = 4;
  o.pairs_per_head = 64;
  return o;
}

const std::string& trained_model() {
  static const std::string path = [] {
    std::ostringstream quiet;
    const learned::LearnedModel m = train::train_foresight(training_set(), quick_options(), quiet);
    const std::string p = test::scratch_file("foresight.h5");
    learned::write_learned_model(m, p);
    return p;
  }();
  return path;
}

}  // namespace

TEST_CASE("a training set holds every layer and KV head of every request, with provenance", "[train]") {
  const train::TrainingSet& set = training_set();
  const ModelGeometry g = training_config(7).geometry;
  CHECK(set.requests == 5);
  CHECK(set.heads.size() == static_cast<std::size_t>(5 * g.n_layers * g.n_kv_heads));
  for (const train::HeadSample& h : set.heads) {
    CHECK(h.x.size() == static_cast<std::size_t>(h.tokens * learned::kFeatureCount));
    CHECK(h.label.size() == static_cast<std::size_t>(h.tokens));
  }
  REQUIRE(set.provenance.traces.size() == 1);
  CHECK(set.provenance.traces[0].second == sha256_file_hex(training_trace()));
  CHECK(set.provenance.requests.size() == 5);
  train::TrainingInputs in;
  in.traces = {training_trace()};
  in.requests = {"r0", "nope"};
  std::ostringstream quiet;
  CHECK_THROWS_WITH(train::load_training_set(in, quiet), Catch::Contains("request 'nope'"));
}

TEST_CASE("foresight learns the golden ranking, reproducibly", "[train]") {
  std::ostringstream log1, log2;
  const learned::LearnedModel a = train::train_foresight(training_set(), quick_options(), log1);
  const learned::LearnedModel b = train::train_foresight(training_set(), quick_options(), log2);
  CHECK(a.network.params() == b.network.params());  // same seed, same machine: same model
  REQUIRE(a.curve.value.size() == 120);
  double first = 0, last = 0;
  for (int i = 0; i < 20; ++i) first += a.curve.value[static_cast<std::size_t>(i)], last += a.curve.value[static_cast<std::size_t>(100 + i)];
  CHECK(last < 0.8 * first);
  // On the held-out request, better than chance (a quarter) at finding the golden top quarter.
  const std::string results = a.results;
  INFO(results);
  CHECK(results.find("held-out requests") != std::string::npos);
  const auto at = results.find("\"golden_overlap_25\":");
  REQUIRE(at != std::string::npos);
  CHECK(std::stod(results.substr(at + 20)) > 0.4);
  CHECK(log1.str().find("train foresight: step 120/120") != std::string::npos);
}

TEST_CASE("a foresight model replays as a policy, held out from its training prompts", "[train]") {
  const std::string model = trained_model();
  const std::string held_out = test::write_small_trace("train_b.h5", training_config(8));
  SweepSpec spec;
  spec.traces = {held_out};
  spec.policies = {"foresight:model=" + model};
  spec.budgets = {0.25, 0.5};
  spec.out_csv = test::scratch_file("foresight_sweep.csv");
  spec.progress = false;
  spec.force = true;
  const auto summary = run_sweep(spec, std::cerr);
  REQUIRE(summary.size() == 2);
  for (const SweepSummaryRow& r : summary) {
    INFO(r.label << " at " << r.budget);
    CHECK(r.kept_fraction <= r.budget + 1e-9);
    CHECK(r.kept_fraction > 0);
  }
  // Its own training prompts: refused unless asked.
  spec.traces = {training_trace()};
  CHECK_THROWS_WITH(run_sweep(spec, std::cerr),
                    Catch::Contains("request 'r0'") && Catch::Contains("was trained on this request's prompt") &&
                        Catch::Contains("--allow-training-requests"));
  spec.allow_training_requests = true;
  CHECK(run_sweep(spec, std::cerr).size() == 2);
  // Another model geometry: refused naming the file.
  SynthConfig wide = training_config(9);
  wide.geometry.n_kv_heads = 4;
  spec.traces = {test::write_small_trace("train_wide.h5", wide)};
  CHECK_THROWS_WITH(run_sweep(spec, std::cerr), Catch::Contains(model) && Catch::Contains("/geometry"));
  CHECK_THROWS_WITH(PolicyRegistry::instance().create("foresight"), Catch::Contains("'model' is required"));
}
