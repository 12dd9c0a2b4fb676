// train/: training sets from traces, the foresight trainer, and its model run as a policy.
#include <catch2/catch.hpp>
#include <bit>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <tuple>
#include <numeric>
#include <sstream>

#include "core/sha256.h"
#include "learned/features.h"
#include "learned/model_file.h"
#include "policies/registry.h"
#include "sim/replay.h"
#include "sim/sweep.h"
#include "trace_fixtures.h"
#include "fake_signals.h"
#include "capture/capture_driver.h"
#include "capture/task_gen.h"
#include "train/distillcache_trainer.h"
#include "train/foresight_trainer.h"
#include "train/plackett_luce.h"
#include "learned_fixtures.h"
#include "train/rlkv_trainer.h"
#include "train/sigmoid_gate_trainer.h"
#include <nlohmann/json.hpp>

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
  for (int i = 0; i < 20; ++i)
    first += a.curve.value[static_cast<std::size_t>(i)], last += a.curve.value[static_cast<std::size_t>(100 + i)];
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
  CHECK_THROWS_WITH(run_sweep(spec, std::cerr), Catch::Contains("request 'r0'") &&
                                                    Catch::Contains("was trained on this request's prompt") &&
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

TEST_CASE("foresight labels per decode block: the golden trajectory, labelled from the blocks to come", "[train]") {
  SynthConfig cfg = training_config(12);
  cfg.generated_tokens = 24;
  train::TrainingInputs in;
  in.traces = {test::write_small_trace("train_blocks.h5", cfg)};
  in.samples.decode_block = 8;
  in.samples.trajectory_budget = 0.5;
  in.samples.labeler = "oracle_golden:block=8";
  std::ostringstream quiet;
  const train::TrainingSet set = train::load_training_set(in, quiet);
  const TraceReader reader(in.traces.front());
  const ModelGeometry& g = set.geometry;
  // Per (request, layer, head): the compression point first, then later decode blocks.
  std::map<std::tuple<int, int, int>, std::vector<std::int64_t>> points;
  for (const train::HeadSample& h : set.heads) points[{h.request, h.layer, h.kv_head}].push_back(h.point);
  REQUIRE(points.size() == static_cast<std::size_t>(set.requests * g.n_layers * g.n_kv_heads));
  for (const auto& [key, p] : points) {
    const std::int64_t c =
        reader.header(set.provenance.requests[static_cast<std::size_t>(std::get<0>(key))].id).n_prompt;
    REQUIRE(p.size() >= 2);
    CHECK(p.front() == c);
    CHECK(std::is_sorted(p.begin(), p.end()));
    CHECK(p.back() > c);
  }
  // A later block's sample holds the trajectory's cache (fewer tokens than were seen), and labels.
  const auto later = std::find_if(set.heads.begin(), set.heads.end(), [&](const train::HeadSample& h) {
    return h.point > reader.header(set.provenance.requests[static_cast<std::size_t>(h.request)].id).n_prompt;
  });
  REQUIRE(later != set.heads.end());
  CHECK(later->tokens < later->point);
  CHECK(later->label.size() == static_cast<std::size_t>(later->tokens));
  train::ForesightOptions o = quick_options();
  o.steps = 20;
  std::ostringstream log;
  const learned::LearnedModel m = train::train_foresight(set, o, log);
  const auto r = nlohmann::json::parse(m.results);
  CHECK(r.at("labels").get<std::string>() == "per decode block of 8 tokens");
  CHECK(r.at("decision_points").get<std::int64_t>() > set.requests);
}

TEST_CASE("the streaming error of a head, by hand", "[train]") {
  test::FakeSignals s(1, 1, 4);
  s.values_[0] = {{1, 0}, {0, 1}, {2, 0}, {0, 2}};
  s.future_[0] = {{0.1f, 0.2f, 0.3f, 0.4f}};
  // Window: token 0 (a sink) and token 3 (the most recent).
  const double full0 = (0.1 * 1 + 0.3 * 2) / 1.0, full1 = (0.2 * 1 + 0.4 * 2) / 1.0;
  const double st0 = 0.1 * 1 / 0.5, st1 = 0.4 * 2 / 0.5;
  const double want = ((st0 - full0) * (st0 - full0) + (st1 - full1) * (st1 - full1)) / (full0 * full0 + full1 * full1);
  CHECK(train::streaming_error(s, 0, {1, 1}) == Approx(want).epsilon(1e-6));
  CHECK(train::streaming_error(s, 0, {0, 4}) == Approx(0.0).margin(1e-12));  // the window holds everything
}

TEST_CASE("rlkv gates learned by REINFORCE open on the heads whose streaming window errs most", "[train]") {
  // The small trace's prompts are ~60 tokens: a window of 2 sinks + 8 recent leaves some out.
  train::TrainingInputs in;
  in.traces = {training_trace()};
  in.samples.window = {2, 8};
  std::ostringstream quiet;
  const train::TrainingSet set = train::load_training_set(in, quiet);
  train::RlkvOptions o;
  o.steps = 300;
  std::ostringstream log;
  const learned::LearnedModel m = train::train_rlkv(set, in, o, log);
  const learned::LearnedModel again = train::train_rlkv(set, in, o, log);
  CHECK(m.head_gates == again.head_gates);
  CHECK(m.curve.metric == "reward_trace");
  for (double r : m.curve.value) CHECK(r <= 0);  // minus a KL estimate
  const ModelGeometry& g = set.geometry;
  REQUIRE(m.head_gates.size() == static_cast<std::size_t>(g.n_layers * g.n_kv_heads));
  // The gates moved from where they started (0.5), both ways.
  CHECK(*std::max_element(m.head_gates.begin(), m.head_gates.end()) > 0.7);
  CHECK(*std::min_element(m.head_gates.begin(), m.head_gates.end()) < 0.3);
  // The heads opened are the ones whose whole cache saves the most: among every mask that opens
  // as many heads, the gates' mask has (nearly) the lowest offline KL. (Offline, a head's saving
  // adds up over heads, so the best mask is known; REINFORCE only sees sampled masks' rewards.)
  const std::size_t N = m.head_gates.size();
  std::vector<std::uint8_t> learned(N);
  int open = 0;
  for (std::size_t i = 0; i < N; ++i) open += learned[i] = m.head_gates[i] > 0.5 ? 1 : 0;
  REQUIRE(open > 0);
  REQUIRE(open < static_cast<int>(N));
  std::vector<std::vector<std::uint8_t>> masks = {learned};
  for (unsigned bits = 0; bits < (1u << N); ++bits) {
    if (std::popcount(bits) != open) continue;
    std::vector<std::uint8_t> mask(N);
    for (std::size_t i = 0; i < N; ++i) mask[i] = (bits >> i) & 1u;
    if (mask != learned) masks.push_back(mask);
  }
  const std::vector<double> kl = train::mask_estimates(set, in, "", masks);
  const auto better = std::count_if(kl.begin() + 1, kl.end(), [&](double x) { return x < kl[0]; });
  INFO(open << " heads open; " << better << " of " << masks.size() - 1 << " other masks are better");
  CHECK(better <= 1);
  CHECK(kl[0] < std::accumulate(kl.begin() + 1, kl.end(), 0.0) / static_cast<double>(kl.size() - 1));
  CHECK(log.str().find("heads gated to the whole cache") != std::string::npos);
  // A stronger sparsity term closes more gates.
  o.sparsity = 4.0;
  const learned::LearnedModel sparse = train::train_rlkv(set, in, o, log);
  CHECK(std::accumulate(sparse.head_gates.begin(), sparse.head_gates.end(), 0.0) <
        std::accumulate(m.head_gates.begin(), m.head_gates.end(), 0.0));
  o.sparsity = 1.0;
  o.reward = "live";
  CHECK_THROWS_WITH(train::train_rlkv(set, in, o, log), Catch::Contains("needs --model"));
  o.reward = "trace";
  // Written and read back, it replays as a policy at a budget.
  const std::string path = test::scratch_file("rlkv_trained.h5");
  learned::write_learned_model(m, path);
  SweepSpec spec;
  spec.traces = {test::write_small_trace("train_c.h5", training_config(10))};
  spec.policies = {"rlkv:model=" + path + ",sinks=4,recent=8"};
  spec.budgets = {0.5};
  spec.out_csv = test::scratch_file("rlkv_sweep.csv");
  spec.progress = false;
  spec.force = true;
  const auto rows = run_sweep(spec, std::cerr);
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].kept_fraction <= 0.5 + 1e-9);
  CHECK(rows[0].kept_fraction > 0.4);
  // Its layers plan their parts of one model-wide allocation: peak semantics, which re-apply a
  // policy layer by layer while decoding, refuse it by name.
  const TraceReader reader(spec.traces.front());
  PolicyInstance inst = PolicyRegistry::instance().create(spec.policies.front());
  const ReplayConfig cfg{inst.name, inst.params, std::shared_ptr<const Policy>(std::move(inst.policy)), 0.5};
  CHECK_THROWS_WITH(
      Replayer(reader, ReplayMode::QueryAware, {cfg}, 0, BudgetRule{true, 2}).replay(reader.request_ids().front()),
      Catch::Contains("divides its budget over the whole model"));
}

TEST_CASE("RLKV's adapter_weights.tsv imports for the trace's geometry, and bad files are named", "[train]") {
  const ModelGeometry g = training_config(7).geometry;  // 4 layers x 2 KV heads
  const std::string path = test::scratch_file("adapter_weights.tsv");
  std::ofstream(path) << "2.5e-01\t9.0e-01\n-3.5e-03\t8.4e-01\n1.0\t0.0\n0.5\t0.25\n";
  const learned::LearnedModel m = train::import_rlkv_tsv(path, g, "t.h5");
  CHECK(m.method == "rlkv");
  CHECK(m.head_gates == std::vector<double>{0.25, 0.9, -0.0035, 0.84, 1.0, 0.0, 0.5, 0.25});
  CHECK(m.provenance.traces.at(0).second == sha256_file_hex(path));
  std::ofstream(path) << "0.1\t0.2\n0.3\n";
  CHECK_THROWS_WITH(train::import_rlkv_tsv(path, g, "t.h5"), Catch::Contains("line 2 has 1 gates; expected 2"));
  std::ofstream(path) << "0.1\t0.2\n0.3\tx\n";
  CHECK_THROWS_WITH(train::import_rlkv_tsv(path, g, "t.h5"), Catch::Contains("line 2, column 2: 'x' is not a number"));
  std::ofstream(path) << "0.1\t0.2\n0.3\t0.4\n";
  CHECK_THROWS_WITH(train::import_rlkv_tsv(path, g, "t.h5"), Catch::Contains("2 lines of gates; expected 4"));
}

TEST_CASE("the gated attention output and its gradient", "[train]") {
  train::HeadSample h;
  h.tokens = 4;
  h.values = {1, 0, 0, 1, 2, 0, 0, 2};
  h.attn = {0.1f, 0.2f, 0.3f, 0.4f, 0.4f, 0.3f, 0.2f, 0.1f};  // two rows
  h.rows = 2;
  const std::vector<double> open(4, 1.0);
  CHECK(train::gated_output_error(h, open) == Approx(0.0).margin(1e-15));
  // Closing token 2 of the first row by hand: o = (0.7, 1.0), o' = (0.1, 1.0) / 0.7.
  const std::vector<double> one_shut = {1, 1, 0, 1};
  const double o0 = 0.7, o1 = 1.0, p0 = 0.1 / 0.7, p1 = 1.0 / 0.7;
  const double row0 = ((p0 - o0) * (p0 - o0) + (p1 - o1) * (p1 - o1)) / (o0 * o0 + o1 * o1);
  const double q0 = 0.8, q1 = 0.5, r0 = 0.4 / 0.8, r1 = 0.5 / 0.8;  // second row: o = (0.8, 0.5), o' over 0.8 mass
  const double row1 = ((r0 - q0) * (r0 - q0) + (r1 - q1) * (r1 - q1)) / (q0 * q0 + q1 * q1);
  CHECK(train::gated_output_error(h, one_shut) == Approx((row0 + row1) / 2).epsilon(1e-6));
  // dError/dgate against central differences at a soft point.
  const std::vector<double> g = {0.9, 0.3, 0.6, 0.2};
  std::vector<double> grad(4, 0.0);
  train::gated_output_error(h, g, &grad);
  for (std::size_t j = 0; j < 4; ++j) {
    std::vector<double> up = g, down = g;
    up[j] += 1e-6;
    down[j] -= 1e-6;
    const double fd = (train::gated_output_error(h, up) - train::gated_output_error(h, down)) / 2e-6;
    INFO("gate " << j);
    CHECK(grad[j] == Approx(fd).epsilon(1e-5).margin(1e-9));
  }
}

TEST_CASE("sigmoid gates train soft within their capacity and report the soft-to-hard gap", "[train]") {
  train::TrainingInputs in;
  in.traces = {training_trace()};
  in.samples.output_rows = 4;
  std::ostringstream log;
  const train::TrainingSet set = train::load_training_set(in, log);
  REQUIRE(set.heads.front().attn.size() ==
          static_cast<std::size_t>(4 * set.geometry.group() * set.heads.front().tokens));
  train::SigmoidGateOptions o;
  o.steps = 150;
  o.hidden = {8};
  o.heads_per_step = 4;
  const learned::LearnedModel m = train::train_sigmoid_gate(set, in, o, log);
  CHECK(m.method == "sigmoid_gate");
  const auto r = nlohmann::json::parse(m.results);
  INFO(m.results);
  // Starting from open gates, the penalty pulls the mean gate down towards the capacity.
  CHECK(r.at("soft_capacity").get<double>() < 0.5);
  CHECK(r.at("soft_error").get<double>() >= 0);
  CHECK(r.at("hard_error_25").get<double>() > 0);
  CHECK(r.at("soft_to_hard_gap").get<double>() ==
        Approx(r.at("hard_error_at_capacity").get<double>() - r.at("soft_error").get<double>()));
  // Deleting more costs more, and training lowered its objective.
  CHECK(r.at("hard_error_50").get<double>() < r.at("hard_error_25").get<double>());
  CHECK(r.at("hard_error_25").get<double>() < r.at("hard_error_10").get<double>());
  REQUIRE(m.curve.value.size() == 150);
  CHECK(m.curve.value.back() < m.curve.value.front());
  CHECK(log.str().find("soft-to-hard gap") != std::string::npos);
  const std::string path = test::scratch_file("sigmoid_gate.h5");
  learned::write_learned_model(m, path);
  CHECK(PolicyRegistry::instance().create("sigmoid_gate:model=" + path).params.find("model=") == 0);
}

TEST_CASE("Plackett-Luce: the log-probability's gradient, and draws follow the softmax", "[train]") {
  const std::vector<double> s = {0.3, -1.2, 2.0, 0.7, 0.0};
  const std::vector<std::int64_t> chosen = {2, 0, 4};
  for (double tau : {1.0, 0.5}) {
    std::vector<double> grad;
    train::pl_log_prob(s, chosen, tau, &grad);
    for (std::size_t j = 0; j < s.size(); ++j) {
      std::vector<double> up = s, down = s;
      up[j] += 1e-6;
      down[j] -= 1e-6;
      const double fd =
          (train::pl_log_prob(up, chosen, tau, nullptr) - train::pl_log_prob(down, chosen, tau, nullptr)) / 2e-6;
      INFO("tau " << tau << " score " << j);
      CHECK(grad[j] == Approx(fd).epsilon(1e-5).margin(1e-8));
    }
  }
  // By hand: the first pick of 2 from exp(s) / Z.
  double z = 0;
  for (double x : s) z += std::exp(x);
  CHECK(train::pl_log_prob(s, std::vector<std::int64_t>{2}, 1.0, nullptr) == Approx(2.0 - std::log(z)));
  // 20000 single draws: frequencies within 0.01 of the softmax.
  Rng rng(3);
  std::vector<double> count(s.size(), 0.0);
  for (int i = 0; i < 20000; ++i)
    count[static_cast<std::size_t>(train::sample_top_k(s, 1, 1.0, rng)[0])] += 1.0 / 20000;
  for (std::size_t j = 0; j < s.size(); ++j) CHECK(count[j] == Approx(std::exp(s[j]) / z).margin(0.01));
  CHECK(train::sample_top_k(s, 3, 1e-9, rng) == std::vector<std::int64_t>{2, 3, 0});  // cold: the top, in order
  // Far-apart scores: the picks hold all the weight, and the log-probability stays finite.
  const std::vector<double> sharp = {40, 0, 0, 0, -30};
  std::vector<double> g;
  const double lp = train::pl_log_prob(sharp, std::vector<std::int64_t>{0, 1}, 1.0, &g);
  CHECK(lp == Approx(-std::log(3.0 + std::exp(-30.0))).epsilon(1e-9));
  for (double x : g) CHECK(std::isfinite(x));
  CHECK(g[0] == Approx(0.0).margin(1e-12));  // certain to be picked first
  CHECK(train::pl_log_prob(sharp, std::vector<std::int64_t>{}, 1.0, &g) == 0.0);
}

TEST_CASE("distillcache trains by REINFORCE on the trace's reward, reproducibly", "[train]") {
  train::TrainingInputs in;
  in.traces = {training_trace()};
  const train::TrainingSet& set = training_set();
  train::DistillCacheOptions o;
  o.episodes = 12;
  o.samples = 3;
  o.hidden = {8};
  o.budgets = {0.25, 0.5};
  std::ostringstream log;
  const learned::LearnedModel a = train::train_distillcache(set, in, o, log);
  const learned::LearnedModel b = train::train_distillcache(set, in, o, log);
  CHECK(a.network.params() == b.network.params());
  CHECK(a.method == "distillcache");
  REQUIRE(a.curve.value.size() == 12);
  for (double r : a.curve.value) CHECK(r <= 0);  // minus an error
  const auto r = nlohmann::json::parse(a.results);
  INFO(a.results);
  CHECK(r.at("evaluated_on").get<std::string>() == "held-out requests");
  CHECK(r.at("estimate_final_25").get<double>() > 0);
  CHECK(r.at("estimate_final_25").get<double>() > r.at("estimate_final_50").get<double>());
  // Training moved the network, and it deploys as a policy.
  const learned::Mlp fresh({learned::kFeatureCount, 8, 1}, learned::Activation::Tanh, o.seed);
  CHECK(a.network.params() != fresh.params());
  const std::string path = test::scratch_file("distillcache.h5");
  learned::write_learned_model(a, path);
  // Bad options are named.
  o.reward = "magic";
  CHECK_THROWS_WITH(train::train_distillcache(set, in, o, log), Catch::Contains("expected trace or live"));
  o.reward = "live";
  CHECK_THROWS_WITH(train::train_distillcache(set, in, o, log), Catch::Contains("needs --model"));
  o.reward = "trace";
  o.discount = 1.5;
  CHECK_THROWS_WITH(train::train_distillcache(set, in, o, log), Catch::Contains("--discount is 1.5"));
  o.discount = 1.0;
  o.init = path;
  o.episodes = 2;
  CHECK_NOTHROW(train::train_distillcache(set, in, o, log));  // warm start from a model of its own
  o.init = test::seeded_model_file("rlkv", set.geometry);
  CHECK_THROWS_WITH(train::train_distillcache(set, in, o, log),
                    Catch::Contains("--init takes a foresight or distillcache"));
}

TEST_CASE("distillcache under peak semantics also acts at decode steps", "[train]") {
  train::TrainingInputs in;
  in.traces = {training_trace()};
  const train::TrainingSet& set = training_set();
  train::DistillCacheOptions o;
  o.episodes = 6;
  o.samples = 2;
  o.hidden = {8};
  o.budgets = {0.5};
  std::ostringstream log;
  const auto count = [&](const learned::LearnedModel& m, const char* key) {
    return nlohmann::json::parse(m.results).at(key).get<std::int64_t>();
  };
  const learned::LearnedModel point = train::train_distillcache(set, in, o, log);
  CHECK(count(point, "actions") > 0);
  CHECK(count(point, "decode_step_actions") == 0);
  o.rule = parse_budget_rule("peak", 2);
  const learned::LearnedModel peak = train::train_distillcache(set, in, o, log);
  const learned::LearnedModel again = train::train_distillcache(set, in, o, log);
  INFO(peak.results);
  CHECK(count(peak, "decode_step_actions") > 0);
  CHECK(count(peak, "actions") > count(point, "actions"));
  CHECK(peak.network.params() == again.network.params());
  CHECK(peak.network.params() != point.network.params());
  CHECK(nlohmann::json::parse(peak.results).at("budget_semantics").get<std::string>() == "peak/2");
}

namespace {

// Two short needle requests captured from SmolLM2 (every query kept, so sigmoid_gate's samples
// have their rows), and their task file.
struct VaultCapture {
  std::vector<CaptureRequest> requests;
  std::string tasks, trace;
};

const VaultCapture& vault_capture() {
  static const VaultCapture v = [] {
    VaultCapture out;
    std::vector<CaptureRequest>& requests = out.requests;
    requests.resize(2);
    const char* codes[] = {"4817", "2290"};
    for (int i = 0; i < 2; ++i) {
      CaptureRequest& r = requests[static_cast<std::size_t>(i)];
      r.id = "vault-" + std::to_string(i);
      r.line = i + 1;
      r.context = std::string("The archive held many letters about the weather, the harvest and the price of grain. ") +
                  "One letter said: the secret code of the vault is " + codes[i] +
                  ". The rest spoke of roads washed out by rain and of a bridge rebuilt twice in one summer.";
      r.question = "What is the secret code of the vault?";
      r.expected = std::string("[\"") + codes[i] + "\"]";
    }
    out.tasks = test::scratch_file("vault_tasks.jsonl");
    write_requests_jsonl(requests, out.tasks, true);
    CaptureOptions co;
    co.model_path = KVSIM_TEST_MODEL;
    co.out_path = out.trace = test::scratch_file("vault.h5");
    co.overwrite = true;
    co.all_queries = true;
    co.max_new = 3;
    run_capture(requests, co);
    return out;
  }();
  return v;
}

}  // namespace

TEST_CASE("distillcache's live reward: the engine runs each sampled cache", "[train][live]") {
  if (!std::filesystem::exists(KVSIM_TEST_MODEL))
    FAIL("SmolLM2 is missing: run scripts/setup.sh (" KVSIM_TEST_MODEL ")");
  const VaultCapture& vault = vault_capture();
  const std::string& tasks = vault.tasks;
  std::vector<CaptureRequest> requests = vault.requests;
  train::TrainingInputs in;
  in.traces = {vault.trace};
  std::ostringstream log;
  const train::TrainingSet set = train::load_training_set(in, log);
  train::DistillCacheOptions o;
  o.reward = "live";
  o.model = KVSIM_TEST_MODEL;
  o.tasks = tasks;
  o.max_new = 3;
  o.episodes = 2;
  o.samples = 2;
  o.hidden = {4};
  o.budgets = {0.3};
  const learned::LearnedModel m = train::train_distillcache(set, in, o, log);
  CHECK(m.curve.metric == "reward_live");
  REQUIRE(m.curve.value.size() == 2);
  for (double r : m.curve.value) CHECK(r < 0);  // minus a live KL: compression at 0.3 changes the outputs
  // A task file without the traces' requests is refused by name.
  const std::string other = test::scratch_file("other_tasks.jsonl");
  requests[0].id = "elsewhere";
  write_requests_jsonl({requests[0]}, other, true);
  o.tasks = other;
  CHECK_THROWS_WITH(train::train_distillcache(set, in, o, log), Catch::Contains("no task 'vault-0'"));
}

TEST_CASE("rlkv's live reward: the engine runs each sampled head mask", "[train][live]") {
  if (!std::filesystem::exists(KVSIM_TEST_MODEL))
    FAIL("SmolLM2 is missing: run scripts/setup.sh (" KVSIM_TEST_MODEL ")");
  const VaultCapture& vault = vault_capture();
  train::TrainingInputs in;
  in.traces = {vault.trace};
  in.samples.window = {2, 8};  // ~60-token prompts: the streaming window leaves most out
  std::ostringstream log;
  const train::TrainingSet set = train::load_training_set(in, log);
  train::RlkvOptions o;
  o.reward = "live";
  o.model = KVSIM_TEST_MODEL;
  o.tasks = vault.tasks;
  o.max_new = 3;
  o.steps = 3;
  o.samples = 2;
  const learned::LearnedModel m = train::train_rlkv(set, in, o, log);
  CHECK(m.curve.metric == "reward_live");
  REQUIRE(m.curve.value.size() == 3);
  for (double r : m.curve.value) CHECK(r <= 0);  // minus a live KL
  CHECK(nlohmann::json::parse(m.results).at("all_streaming_kl").get<double>() > 0);
  // The gates moved off their start.
  CHECK(std::any_of(m.head_gates.begin(), m.head_gates.end(), [](double g) { return std::abs(g - 0.5) > 1e-3; }));
}

TEST_CASE("sigmoid_gate's live soft-to-hard gap: the engine runs the soft-gated cache", "[train][live]") {
  if (!std::filesystem::exists(KVSIM_TEST_MODEL))
    FAIL("SmolLM2 is missing: run scripts/setup.sh (" KVSIM_TEST_MODEL ")");
  const VaultCapture& vault = vault_capture();
  train::TrainingInputs in;
  in.traces = {vault.trace};
  in.samples.output_rows = 4;
  std::ostringstream log;
  const train::TrainingSet set = train::load_training_set(in, log);
  train::SigmoidGateOptions o;
  o.steps = 30;
  o.hidden = {4};
  o.heads_per_step = 4;
  o.model = KVSIM_TEST_MODEL;
  o.tasks = vault.tasks;
  o.max_new = 3;
  const learned::LearnedModel m = train::train_sigmoid_gate(set, in, o, log);
  const auto r = nlohmann::json::parse(m.results);
  INFO(m.results);
  CHECK(r.at("live_requests").get<int>() == 2);
  // Gates below 1 that differ between tokens move the live outputs, and so does hard deletion.
  CHECK(r.at("live_kl_soft").get<double>() > 0);
  CHECK(r.at("live_kl_hard_at_capacity").get<double>() > 0);
  CHECK(r.at("live_soft_to_hard_gap").get<double>() ==
        Approx(r.at("live_kl_hard_at_capacity").get<double>() - r.at("live_kl_soft").get<double>()));
  CHECK(log.str().find("live, 2 requests") != std::string::npos);
  o.tasks.clear();
  CHECK_THROWS_WITH(train::train_sigmoid_gate(set, in, o, log), Catch::Contains("needs both --model"));
}
