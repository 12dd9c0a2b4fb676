// train/step_credit: returns-to-go, the per-step baseline, and a toy where an early eviction hurts
// only a later step, trained by REINFORCE with the same credit and Plackett-Luce gradient
// `kvsim train distillcache` uses.
#include <catch2/catch.hpp>
#include <numeric>

#include "core/rng.h"
#include "train/plackett_luce.h"
#include "train/step_credit.h"

using namespace kvsim;
using train::StepCredit;

TEST_CASE("returns-to-go and the per-step leave-one-out baseline, by hand", "[train][credit]") {
  const std::vector<double> g = train::returns_to_go({1, 2, 3}, 0.5);
  REQUIRE(g.size() == 4);
  CHECK(g[0] == Approx(1 + 0.5 * (2 + 0.5 * 3)));
  CHECK(g[1] == Approx(2 + 0.5 * 3));
  CHECK(g[2] == Approx(3));
  CHECK(g[3] == 0);
  // Three samples that differ only at step 1: an action from step 2 on gets no credit for it.
  const StepCredit c({{-1, -3, -1, -1}, {-1, 0, -1, -1}, {-1, 0, -1, -1}}, 1.0);
  CHECK(c.advantage(0, 0) == Approx(-3.0));
  CHECK(c.advantage(1, 1) == Approx(1.5));
  CHECK(c.advantage(0, 2) == 0);
  CHECK(c.advantage(0, 4) == 0);  // past the last step: nothing measured
  CHECK(c.return_from(0, 0) == Approx(-6));
  // An action at cache size n changes the steps whose query token is >= n.
  const std::vector<std::int64_t> queries = {10, 11, 12, 13};
  CHECK(train::first_affected_step(queries, 10) == 0);
  CHECK(train::first_affected_step(queries, 12) == 2);
  CHECK(train::first_affected_step(queries, 99) == 4);
  CHECK_THROWS_WITH(StepCredit({{0, 0}}, 1.0), Catch::Contains("at least 2 samples"));
  CHECK_THROWS_WITH(StepCredit({{0, 0}, {0}}, 1.0), Catch::Contains("differ in steps"));
  CHECK_THROWS_WITH(StepCredit({{0}, {0}}, 1.5), Catch::Contains("not in [0, 1]"));
}

namespace {

// The toy: 8 steps, query tokens 10..17. Action A at the compression point (cache size 10) keeps
// 3 of 4 tokens; evicting token 0 there costs -1 at step 6 only (a later query needs it). Action B
// at cache size 14 (first step 4) keeps 3 of 4 other tokens and changes nothing. Every step's
// reward also carries noise. Each action is a Plackett-Luce draw over its own 4 scores (one
// parameter per token), trained by REINFORCE with the trainer's credit.
struct Toy {
  std::vector<double> a = std::vector<double>(4, 0.0), b = std::vector<double>(4, 0.0);
};

void train_toy(Toy& toy, double discount, int episodes, std::uint64_t seed) {
  const std::vector<std::int64_t> queries = {10, 11, 12, 13, 14, 15, 16, 17};
  constexpr int kSamples = 16;
  Rng rng(seed);
  for (int ep = 0; ep < episodes; ++ep) {
    std::vector<std::vector<std::int64_t>> pick_a, pick_b;
    std::vector<std::vector<double>> rewards;
    for (int k = 0; k < kSamples; ++k) {
      pick_a.push_back(train::sample_top_k(toy.a, 3, 1.0, rng));
      pick_b.push_back(train::sample_top_k(toy.b, 3, 1.0, rng));
      std::vector<double> r(queries.size());
      for (double& x : r) x = 0.1 * rng.normal();
      const auto& kept = pick_a.back();
      if (std::find(kept.begin(), kept.end(), 0) == kept.end()) r[6] -= 1.0;
      rewards.push_back(std::move(r));
    }
    const StepCredit credit(rewards, discount);
    std::vector<double> ga(4, 0.0), gb(4, 0.0), d;
    for (int k = 0; k < kSamples; ++k) {
      const double adv_a = credit.advantage(k, train::first_affected_step(queries, 10));
      const double adv_b = credit.advantage(k, train::first_affected_step(queries, 14));
      train::pl_log_prob(toy.a, pick_a[static_cast<std::size_t>(k)], 1.0, &d);
      for (int j = 0; j < 4; ++j) ga[j] += adv_a * d[j] / kSamples;
      train::pl_log_prob(toy.b, pick_b[static_cast<std::size_t>(k)], 1.0, &d);
      for (int j = 0; j < 4; ++j) gb[j] += adv_b * d[j] / kSamples;
    }
    for (int j = 0; j < 4; ++j) {  // ascent on the expected return
      toy.a[j] += 0.5 * ga[j];
      toy.b[j] += 0.5 * gb[j];
    }
  }
}

// How far token 0's score stands above the others' mean, and the spread of B's scores.
double lead_of_token0(const std::vector<double>& s) { return s[0] - (s[1] + s[2] + s[3]) / 3; }
double spread(const std::vector<double>& s) {
  return *std::max_element(s.begin(), s.end()) - *std::min_element(s.begin(), s.end());
}

}  // namespace

TEST_CASE("credit for a late harm lands on the early eviction that caused it", "[train][credit]") {
  for (std::uint64_t seed : {1, 2, 3}) {
    INFO("seed " << seed);
    Toy credited;
    train_toy(credited, 1.0, 150, seed);
    INFO("A " << credited.a[0] << " " << credited.a[1] << " " << credited.a[2] << " " << credited.a[3]);
    INFO("B " << credited.b[0] << " " << credited.b[1] << " " << credited.b[2] << " " << credited.b[3]);
    // A learns to keep token 0: it is evicted only when it comes last in the draw.
    CHECK(lead_of_token0(credited.a) > 2.0);
    // B, whose choice changes nothing, is left near where it started.
    CHECK(spread(credited.b) < 0.6 * lead_of_token0(credited.a));
    // Credited with its immediate reward only, A never sees the harm it does at step 6.
    Toy myopic;
    train_toy(myopic, 0.0, 150, seed);
    CHECK(std::abs(lead_of_token0(myopic.a)) < 0.6);
  }
}
