// Decode rules (core/decode_rule.h): the rule a policy hands out evicts exactly what its own
// step() evicts, step after step, ties included; the reference refuses state out of step.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <set>

#include "core/decode_rule.h"
#include "fake_signals.h"
#include "policies/registry.h"

using namespace kvsim;

namespace {

// Weights in eighths: ties between tokens (and between sums) are common.
float eighths(std::mt19937& rng) { return static_cast<float>(std::uniform_int_distribution<int>(0, 7)(rng)) / 8.0f; }

void fill_signals(test::FakeSignals& s, int n_q, std::int64_t n, std::mt19937& rng) {
  for (int q = 0; q < n_q; ++q) {
    test::Rows obs, win;
    obs.rows = n, obs.cols = n, win.rows = 1, win.cols = n;
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < n; ++j) obs.data.push_back(j <= i ? eighths(rng) : 0.0f);
    for (std::int64_t j = 0; j < n; ++j) win.data.push_back(eighths(rng));
    s.observed_[q] = obs;
    s.window_[q] = win;
  }
}

}  // namespace

TEST_CASE("a policy's decode rule evicts what its own step evicts", "[decode_rule]") {
  const int n_q = 4, n_kv = 2, G = n_q / n_kv;
  const std::int64_t n = 12, budget = 6;
  for (const std::string spec :
       {"h2o", "h2o:gqa=mean", "h2o:gqa=max", "h2o:recent_ratio=0.25", "h2o:recent_ratio=0", "tova"}) {
    INFO(spec);
    std::mt19937 rng(7);
    test::FakeSignals s(n_q, n_kv, n);
    fill_signals(s, n_q, n, rng);
    const auto inst = PolicyRegistry::instance().create(spec);
    const LayerPlan plan = inst.policy->compress(s, Budget{budget, 0.5});
    auto state = inst.policy->start_decode(s, plan, Budget{budget, 0.5});
    REQUIRE(state);
    const auto start = state->rule();
    REQUIRE(start);
    DecodeRuleStart rule = *start;
    std::vector<std::vector<std::int32_t>> cache(n_kv);
    for (int kv = 0; kv < n_kv; ++kv)
      for (std::int64_t m = 0; m < n; ++m)
        if (plan.heads[static_cast<std::size_t>(kv)].codec[static_cast<std::size_t>(m)] != TokenCodec::Drop)
          cache[static_cast<std::size_t>(kv)].push_back(static_cast<std::int32_t>(m));
    int evictions = 0;
    for (std::int32_t t = static_cast<std::int32_t>(n); t < 40; ++t) {
      for (auto& c : cache) c.push_back(t);
      std::vector<std::int64_t> rows;
      std::int64_t stride = 0;
      for (const auto& c : cache)
        rows.push_back(static_cast<std::int64_t>(c.size())), stride = std::max(stride, rows.back());
      std::vector<std::vector<float>> weights(n_q);
      std::vector<float> flat(static_cast<std::size_t>(n_q * stride), 0.0f);
      for (int q = 0; q < n_q; ++q)
        for (std::size_t m = 0; m < cache[static_cast<std::size_t>(q / G)].size(); ++m) {
          weights[static_cast<std::size_t>(q)].push_back(eighths(rng));
          flat[static_cast<std::size_t>(q * stride) + m] = weights[static_cast<std::size_t>(q)].back();
        }
      // A budget that shrinks mid-way evicts several tokens in one step.
      const std::int64_t b = t < 30 ? budget : budget - 2;
      std::vector<std::vector<std::int32_t>> evict(n_kv);
      state->step(DecodeStep{t, cache, weights, b}, evict);
      const auto gone =
          decode_rule_step_ref(rule.rule, rule.scores, rows, LastRowWeights{flat.data(), stride, n_q, G}, b);
      REQUIRE(gone.size() == static_cast<std::size_t>(n_kv));
      for (int kv = 0; kv < n_kv; ++kv) {
        auto& c = cache[static_cast<std::size_t>(kv)];
        std::set<std::int32_t> by_rule,
            by_step(evict[static_cast<std::size_t>(kv)].begin(), evict[static_cast<std::size_t>(kv)].end());
        for (const auto r : gone[static_cast<std::size_t>(kv)]) by_rule.insert(c[static_cast<std::size_t>(r)]);
        INFO("step " << t << ", KV head " << kv);
        REQUIRE(by_rule == by_step);
        CHECK(std::is_sorted(gone[static_cast<std::size_t>(kv)].begin(), gone[static_cast<std::size_t>(kv)].end()));
        evictions += static_cast<int>(by_rule.size());
        std::erase_if(c, [&](std::int32_t tok) { return by_rule.count(tok) > 0; });
      }
    }
    CHECK(evictions >= 2 * 28);  // every step evicted (one token per KV head, more when the budget shrank)
  }
}

TEST_CASE("position-only and re-tiering policies state no rule", "[decode_rule]") {
  test::FakeSignals s(2, 1, 6);
  auto state =
      PolicyRegistry::instance().create("streamingllm:sinks=2").policy->start_decode(s, LayerPlan{}, Budget{4, 0.5});
  REQUIRE(state);
  CHECK_FALSE(state->rule());
}

TEST_CASE("the decode rule reference refuses state out of step with the cache", "[decode_rule]") {
  const std::vector<float> w(8, 0.25f);
  const LastRowWeights weights{w.data(), 4, 2, 1};
  std::vector<std::vector<double>> scores{{0.1, 0.2, 0.3}, {0.1, 0.2}};
  // Entry 1 holds 4 rows but its scores cover 2: two rows joined since the last step.
  CHECK_THROWS_WITH(decode_rule_step_ref(DecodeRule{}, scores, {4, 4}, weights, 3),
                    Catch::Contains("entry 1 holds 4 rows, its scores cover 2"));
  DecodeRule wide{false, true, HeadCombine::Sum, 1};
  CHECK_THROWS_WITH(decode_rule_step_ref(wide, scores, {4, 3}, weights, 3), Catch::Contains("unequal rows"));
  CHECK_THROWS_WITH(decode_rule_step_ref(DecodeRule{}, scores, {4, 4, 4}, weights, 3), Catch::Contains("3 entries"));
  CHECK_THROWS_WITH(check_rule_start(DecodeRuleStart{DecodeRule{}, {{0.5}}}, {2, 2}, 2),
                    Catch::Contains("scores for 1 entries, expected 2"));
  CHECK_THROWS_WITH(check_rule_start(DecodeRuleStart{DecodeRule{}, {{0.5}, {0.5}}}, {1, 2}, 2),
                    Catch::Contains("entry 1 holds 2 rows, its scores cover 1"));
  // A rule that does not accumulate needs no scores; its rows restart every step.
  std::vector<std::vector<double>> none;
  const auto gone = decode_rule_step_ref(
      DecodeRule{false, false, HeadCombine::Sum, 1}, none, {4, 4},
      LastRowWeights{std::vector<float>{0.4f, 0.1f, 0.3f, 0.2f, 0.1f, 0.1f, 0.5f, 0.3f}.data(), 4, 2, 1}, 2);
  CHECK(gone[0] == std::vector<std::int64_t>{1, 2});  // lowest two outside the newest: 0.1 (row 1), 0.3 (row 2)
  CHECK(gone[1] == std::vector<std::int64_t>{0, 1});  // 0.1 and 0.1 tie: both go, the newest (0.3) is protected
}
