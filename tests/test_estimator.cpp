// The offline estimate of live KL: NNLS, the layer-weight fit, the estimator file, calibration
// from sweep and verify rows, and the held-out agreement report.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "core/error.h"
#include "sim/estimator.h"
#include "verify/agreement.h"
#include "verify/calibrate.h"
#include "verify/live_results.h"

using namespace kvsim;
using Catch::Contains;

namespace {

std::filesystem::path temp_file(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / "kvsim_test_estimator";
  std::filesystem::create_directories(dir);
  return dir / name;
}

void write(const std::filesystem::path& p, const std::string& text) { std::ofstream(p) << text; }

// Offline rows of `requests` x `configs` whose per-layer features are random, and live rows whose
// KL is the planted weights' sum of them (times a per-request factor when `noise`).
struct Planted {
  std::vector<OfflineRow> offline;
  LiveResults live;
};
Planted planted(const std::vector<double>& w, int requests, int configs, double noise, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  Planted p;
  p.live.mode = "query-aware";
  for (int r = 0; r < requests; ++r)
    for (int c = 0; c < configs; ++c) {
      OfflineRow o;
      o.request = "r" + std::to_string(r);
      o.mode = "query-aware";
      o.policy = "pol" + std::to_string(c % 6);
      o.budget = 0.1 * (1 + c / 6);
      double kl = 0;
      for (double wl : w) {
        o.layer_out_sq.push_back(u(rng) * (1.0 + c % 5));
        kl += wl * o.layer_out_sq.back();
      }
      kl *= 1.0 + noise * (u(rng) - 0.5);
      p.live.rows.push_back({o.request, o.policy, "", o.budget, kl, 0.5, std::nan("")});
      p.offline.push_back(std::move(o));
    }
  return p;
}

}  // namespace

TEST_CASE("nnls: the constrained optimum where plain least squares goes negative", "[estimator]") {
  // A = [[1,0],[0,1],[1,1]], b = [1,-1,0]: unconstrained x = (1,-1); with x >= 0 the second
  // coefficient is 0 and the first minimises (x-1)^2 + 1 + x^2: x = 0.5.
  const auto x = nnls({1, 0, 0, 1, 1, 1}, 3, 2, {1, -1, 0});
  CHECK(x[0] == Approx(0.5).margin(1e-12));
  CHECK(x[1] == 0.0);
  // A positive exact solution comes back exactly.
  const auto y = nnls({2, 0, 0, 3, 1, 1}, 3, 2, {4, 3, 3});
  CHECK(y[0] == Approx(2.0));
  CHECK(y[1] == Approx(1.0));
  CHECK_THROWS_WITH(nnls({1, 2}, 2, 2, {1, 2}), Contains("matrix entries"));
}

TEST_CASE("layer weights: planted non-negative weights are recovered; smoothness evens them across depth",
          "[estimator]") {
  const std::vector<double> w = {0.0, 0.5, 2.0, 0.0, 1.0, 0.25};
  const Planted p = planted(w, 8, 24, 0.0, 7);
  std::vector<std::vector<double>> X;
  std::vector<double> y;
  for (std::size_t i = 0; i < p.offline.size(); ++i) {
    X.push_back(p.offline[i].layer_out_sq);
    y.push_back(p.live.rows[i].live_kl);
  }
  const auto fit = fit_layer_weights(X, y, 0.0);
  for (std::size_t l = 0; l < w.size(); ++l) CHECK(fit[l] == Approx(w[l]).margin(1e-9));
  // A strong second-difference penalty: a smoother profile (smaller curvature), still >= 0.
  auto curvature = [](const std::vector<double>& v) {
    double s = 0;
    for (std::size_t l = 0; l + 2 < v.size(); ++l) s += std::pow(v[l] - 2 * v[l + 1] + v[l + 2], 2);
    return s;
  };
  const auto smooth = fit_layer_weights(X, y, 10.0);
  CHECK(curvature(smooth) < 0.1 * curvature(fit));
  for (double x : smooth) CHECK(x >= 0.0);
  CHECK_THROWS_WITH(fit_layer_weights(X, {1.0}, 0.1), Contains("targets"));
  const std::vector<std::vector<double>> zeros(4, std::vector<double>(3, 0.0));
  CHECK_THROWS_WITH(fit_layer_weights(zeros, {1, 2, 3, 4}, 0.1), Contains("output error is zero"));
}

TEST_CASE("estimator files round-trip; a bad file names the field and what was expected", "[estimator]") {
  Estimator e;
  e.weights = {0.1, 0.0, 2.5};
  e.smoothness = 0.1;
  e.mode = "query-agnostic";
  e.requests = {"a", "b"};
  e.configs = 12;
  e.rows = 24;
  e.fit_spearman = 0.93;
  const auto path = temp_file("est.json").string();
  write_estimator(e, path);
  const Estimator r = read_estimator(path);
  CHECK(r.weights == e.weights);
  CHECK(r.mode == e.mode);
  CHECK(r.requests == e.requests);
  CHECK(r.configs == 12);
  CHECK(r.fit_spearman == Approx(0.93));
  CHECK(r.predict({1, 5, 2}, "x") == Approx(0.1 + 5.0));
  CHECK_THROWS_WITH(r.predict({1, 2}, "sweep.jsonl"), Contains("sweep.jsonl") && Contains("3 layer weights"));

  const auto bad = temp_file("bad.json");
  write(bad, R"({"kvsim_estimator": 1, "feature": "layer_out_sq", "target": "live_kl", "smoothness": 0.1})");
  CHECK_THROWS_WITH(read_estimator(bad.string()), Contains("bad.json") && Contains("'weights'"));
  write(bad, R"({"kvsim_estimator": 2})");
  CHECK_THROWS_WITH(read_estimator(bad.string()), Contains("'kvsim_estimator'") && Contains("expected 1"));
  write(bad, R"({"kvsim_estimator": 1, "feature": "layer_out_sq", "target": "live_kl", "weights": [1, -2],
                 "smoothness": 0, "mode": "query-aware", "calibration": {"requests": [], "configs": 1, "rows": 1,
                 "fit_spearman": null}})");
  CHECK_THROWS_WITH(read_estimator(bad.string()), Contains("'weights'") && Contains(">= 0"));
  write(bad, R"({"kvsim_estimator": 1, "feature": "layer_out_sq", "target": "live_kl", "weights": "x"})");
  CHECK_THROWS_WITH(read_estimator(bad.string()), Contains("'weights' is \"x\"") && Contains("an array of numbers"));
  write(bad, "not json");
  CHECK_THROWS_WITH(read_estimator(bad.string()), Contains("not valid JSON"));
  // fuzz_estimator's find: a count past int's range was converted unchecked (undefined behaviour).
  write(bad, R"({"kvsim_estimator": 1, "feature": "layer_out_sq", "target": "live_kl", "weights": [1],
                 "smoothness": 0, "mode": "query-aware", "calibration": {"requests": [], "configs": 6.7e20,
                 "rows": 1}})");
  CHECK_THROWS_WITH(read_estimator(bad.string()), Contains("'configs' is 6.7e+20") && Contains("expected an integer"));
}

TEST_CASE("verify results read back, generated text spanning lines included", "[estimator]") {
  const auto path = temp_file("verify.csv");
  write(path,
        "# kvsim verify results\n# config: {}\n"
        "request,task,mode,policy,params,budget,live_kl,top1,task_score,generated\n"
        "r1,needle,query-aware,snapkv,,0.25,0.5,0.75,nan,\"two\nlines, and \"\"quotes\"\"\"\n"
        "r2,needle,query-aware,h2o,recent_ratio=0.25,0.1,1.25,0.5,1,plain\n");
  const LiveResults r = read_verify_csv(path.string());
  REQUIRE(r.rows.size() == 2);
  CHECK(r.mode == "query-aware");
  CHECK(r.rows[0].live_kl == 0.5);
  CHECK(std::isnan(r.rows[0].task_score));
  CHECK(r.rows[1].params == "recent_ratio=0.25");
  CHECK(r.rows[1].budget == 0.1);
  write(path, "request,mode,policy,params,budget,top1,task_score\nr1,query-aware,snapkv,,0.25,0.5,1\n");
  CHECK_THROWS_WITH(read_verify_csv(path.string()), Contains("verify.csv:1") && Contains("'live_kl'"));
  write(path, "request,mode,policy,params,budget,live_kl,top1,task_score\nr1,query-aware,snapkv,,0.25,-1,0.5,1\n");
  CHECK_THROWS_WITH(read_verify_csv(path.string()), Contains("verify.csv:2") && Contains(">= 0"));
  // fuzz_verify_csv's find: a repeated column made rows as wide as the distinct names pass, and the
  // later copy's index read past the row.
  write(path,
        "request,mode,policy,params,budget,live_kl,top1,task_score,policy\nr1,query-aware,snapkv,,0.25,1,0.5,1\n");
  CHECK_THROWS_WITH(read_verify_csv(path.string()), Contains("verify.csv:1") && Contains("'policy' appears twice"));
}

TEST_CASE("calibration on some requests predicts the others; agreement leaves the calibration requests out",
          "[estimator]") {
  const std::vector<double> w = {0.2, 0.0, 1.0, 3.0};
  Planted p = planted(w, 6, 24, 0.2, 11);
  // Calibrate on requests r0 and r1 only.
  LiveResults cal;
  cal.mode = p.live.mode;
  for (const auto& l : p.live.rows)
    if (l.request == "r0" || l.request == "r1") cal.rows.push_back(l);
  const Estimator e = calibrate_estimator(p.offline, cal, 0.1, "sweep.csv");
  CHECK(e.requests == std::vector<std::string>{"r0", "r1"});
  CHECK(e.configs == 24);
  CHECK(e.rows == 48);
  CHECK(e.fit_spearman > 0.9);
  apply_estimator(p.offline, e, "sweep.jsonl");
  for (const auto& o : p.offline) CHECK(o.metrics.at("est_kl") >= 0.0);
  const AgreementReport rep = agreement(p.offline, p.live.rows, {"est_kl", "absent_metric"}, 5, e.requests, 8);
  CHECK(rep.excluded == std::vector<std::string>{"r0", "r1"});
  CHECK(rep.requests == 4);
  CHECK(rep.configs == 24);
  REQUIRE(rep.rows.size() == 1);  // a metric no row has is left out
  CHECK(rep.rows[0].spearman_kl > 0.9);
  CHECK(rep.rows[0].within_budget_min_spearman_kl <= rep.rows[0].within_budget_spearman_kl);
  CHECK(rep.rows[0].top_in_wider >= rep.rows[0].top_recall);

  // Refusals: another mode, missing per-layer errors, too few configs.
  LiveResults other = cal;
  other.mode = "query-agnostic";
  CHECK_THROWS_WITH(calibrate_estimator(p.offline, other, 0.1, "sweep.csv"), Contains("one mode at a time"));
  std::vector<OfflineRow> bare = p.offline;
  for (auto& o : bare) o.layer_out_sq.clear();
  CHECK_THROWS_WITH(calibrate_estimator(bare, cal, 0.1, "sweep.csv"), Contains("no layer_out_sq"));
  LiveResults few = cal;
  few.rows.resize(1);
  CHECK_THROWS_WITH(calibrate_estimator(p.offline, few, 0.1, "sweep.csv"), Contains("at least 3"));
  // Budgets held under different semantics on the two sides, or one request twice: refused.
  std::vector<OfflineRow> peak = p.offline;
  for (auto& o : peak) o.semantics = "peak/64";
  LiveResults point = cal;
  point.semantics = "point";
  CHECK_THROWS_WITH(calibrate_estimator(peak, point, 0.1, "sweep.csv"), Contains("budget_semantics"));
  std::vector<OfflineRow> twice = p.offline;
  twice.push_back(p.offline.front());
  CHECK_THROWS_WITH(calibrate_estimator(twice, cal, 0.1, "sweep.csv"), Contains("two rows"));
  Estimator wrong = e;
  wrong.weights.push_back(1.0);
  CHECK_THROWS_WITH(apply_estimator(p.offline, wrong, "sweep.jsonl"), Contains("5 layer weights"));
}
