// QEvict's three tiers on a worked example small enough to check by hand: window snapping,
// pins, the fp16 share, the quantized tier's partial window, host bytes, and decode re-tiering.
#include <catch2/catch.hpp>

#include <map>
#include <set>

#include "core/error.h"
#include "fake_signals.h"
#include "policies/codec.h"
#include "policies/registry.h"

using namespace kvsim;
using test::FakeSignals;

namespace {

std::set<int> with(const HeadPlan& p, TokenCodec c) {
  std::set<int> s;
  for (std::size_t j = 0; j < p.codec.size(); ++j)
    if (p.codec[j] == c) s.insert(static_cast<int>(j));
  return s;
}

// 16 tokens, head_dim 32 (fp16 token: 128 B for K+V; int4 min-max group 32: 2 x 20 = 40 B).
// System 0-1, context 2-15; snapkv with one query window and no pooling scores the context.
FakeSignals example() {
  FakeSignals s(1, 1, 16, 0, 1, 32);
  s.set_segments({0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1});
  s.window_[0] = {{0, 0, .1f, .1f, .1f, .1f, .3f, .2f, .4f, .3f, .05f, .02f, .08f, .05f, 0, 0}};
  return s;
}

const std::string kBase = "qevict:base=snapkv/window=1/kernel=1/pool=none,window=4,sinks=0,recent=2,group=32";
const std::string kSpec = kBase + ",bits=4,retier=0";  // no decode state: no 4 B score per token

LayerPlan run(const std::string& spec, const LayerSignals& s, double fraction) {
  return PolicyRegistry::instance().create(spec).policy->compress(s, Budget{0, fraction});
}

}  // namespace

TEST_CASE("qevict fills fp16 with pins and top windows, then int4, then deletes", "[qevict]") {
  const FakeSignals s = example();
  // Windows: [0,1] system (pinned), [2-5] mean .1, [6-9] mean .3, [10-13] mean .05, [14,15] recent (pinned).
  // Budget 0.5 = 1024 B: pins take 512 B = the fp16 share; every context window fits as int4 (12 x 40 B).
  LayerPlan p = run(kSpec, s, 0.5);
  CHECK(with(p.heads[0], TokenCodec::Fp16) == std::set<int>{0, 1, 14, 15});
  CHECK(with(p.heads[0], TokenCodec::Int4) == std::set<int>{2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13});
  // hi_share=1 is keep/drop: the best window joins the pins in fp16 and nothing is quantized.
  p = run(kSpec + ",hi_share=1", s, 0.5);
  CHECK(with(p.heads[0], TokenCodec::Fp16) == std::set<int>{0, 1, 6, 7, 8, 9, 14, 15});
  CHECK(with(p.heads[0], TokenCodec::Int4).empty());
  // Budget 0.375 = 768 B: pins 512 B, then 6 int4 tokens: window [6-9] whole, then the two most
  // recent of the tied window [2-5].
  const auto policy = PolicyRegistry::instance().create(kSpec).policy;
  p = policy->compress(s, Budget{0, 0.375});
  CHECK(with(p.heads[0], TokenCodec::Fp16) == std::set<int>{0, 1, 14, 15});
  CHECK(with(p.heads[0], TokenCodec::Int4) == std::set<int>{4, 5, 6, 7, 8, 9});
  CHECK(policy->codec()->bytes(p.heads[0], 32) == 4 * 128.0 + 6 * 40.0);
  CHECK(policy->codec()->host_bytes(p.heads[0], 32) == 6 * 128.0);  // the quantized tier's fp16 copy
  // Budget 0.25 = 512 B: only the pins.
  p = run(kSpec, s, 0.25);
  CHECK(with(p.heads[0], TokenCodec::Fp16) == std::set<int>{0, 1, 14, 15});
  CHECK(with(p.heads[0], TokenCodec::Drop).size() == 12);
}

TEST_CASE("qevict never exceeds its byte budget", "[qevict]") {
  const FakeSignals s = example();
  for (const std::string extra :
       {"", ",hi_share=0", ",hi_share=1", ",bits=2", ",bits=8,agg=max", ",pin=none", ",retier=64"}) {
    const auto policy = PolicyRegistry::instance().create(kBase + extra).policy;
    for (double b : {0.05, 0.1, 0.2, 0.25, 0.3, 0.5, 0.7}) {
      const LayerPlan p = policy->compress(s, Budget{0, b});
      const double state = policy->state_bytes_per_token() * static_cast<double>(p.heads[0].kept());
      CHECK(policy->codec()->bytes(p.heads[0], 32) + state <= b * 16 * 128.0 + 1e-9);
    }
  }
}

namespace {

// Re-tiers once after two decode steps (tokens 16 and 17 joining as `segment`, all the attention
// on token `attended`) and returns each cached token's tier.
std::map<int, TokenCodec> after_retier(const std::string& spec, const FakeSignals& s, int segment, int attended = 8) {
  const auto policy = PolicyRegistry::instance().create(spec).policy;
  const LayerPlan initial = policy->compress(s, Budget{0, 0.4});
  auto state = policy->start_decode(s, initial, Budget{0, 0.4});
  REQUIRE(state);
  std::vector<std::vector<std::int32_t>> cache(1), evict;
  for (int j = 0; j < 16; ++j)
    if (initial.heads[0].codec[static_cast<std::size_t>(j)] != TokenCodec::Drop) cache[0].push_back(j);
  LayerPlan next;
  for (int step = 0; step < 2; ++step) {
    const auto t = static_cast<std::int32_t>(16 + step);
    cache[0].push_back(t);
    std::vector<std::vector<float>> weights(1, std::vector<float>(cache[0].size(), 0.0f));
    for (std::size_t m = 0; m < cache[0].size(); ++m)
      if (cache[0][m] == attended) weights[0][m] = 1.0f;
    evict.assign(1, {});
    state->step(DecodeStep{t, cache, weights, 0, segment}, evict);
    CHECK(evict[0].empty());
    const bool retiered = state->retier(DecodeStep{t, cache, {}, 0}, next);
    CHECK(retiered == (step == 1));
  }
  REQUIRE(next.heads.size() == 1);
  std::map<int, TokenCodec> tiers;
  for (std::size_t m = 0; m < cache[0].size(); ++m) tiers[cache[0][m]] = next.heads[0].codec[m];
  return tiers;
}

std::set<int> fp16_after_retier(const std::string& spec, const FakeSignals& s, int segment) {
  std::set<int> fp16;
  for (const auto& [token, codec] : after_retier(spec, s, segment))
    if (codec == TokenCodec::Fp16) fp16.insert(token);
  return fp16;
}

}  // namespace

TEST_CASE("qevict re-tiers in decode by score plus accumulated attention", "[qevict]") {
  const FakeSignals s = example();
  // With a decode state every kept token also holds a 4 B score: fp16 132 B, int4 44 B. Budget
  // 0.4 = 819.2 B: pins 528 B, int4 [6-9] and the two most recent of [2-5] as before.
  const std::string spec = kBase + ",bits=4,retier=2";
  const LayerPlan initial = PolicyRegistry::instance().create(spec).policy->compress(s, Budget{0, 0.4});
  CHECK(with(initial.heads[0], TokenCodec::Int4) == std::set<int>{4, 5, 6, 7, 8, 9});
  // Two decode steps in which token 8 (int4) draws all the attention, then the re-tier.
  // Scores are mean attention per observation, the prompt score (normalised to sum 1) the first:
  // token 8 (.4/1.8 + 2) / 3. Cache 0,1,4-9,14-17: windows [0,1] pinned, [4-7] .032, [8,9] .40,
  // [14,15] 0 (no longer recent), [16,17] recent (pinned). Budget 819.2 B: pins 528 B, then int4
  // [8,9] and [4-7]; 14 and 15 are deleted.
  std::set<int> fp16, int4, drop;
  for (const auto& [token, c] : after_retier(spec, s, -1))
    (c == TokenCodec::Fp16 ? fp16 : c == TokenCodec::Int4 ? int4 : drop).insert(token);
  CHECK(fp16 == std::set<int>{0, 1, 16, 17});
  CHECK(int4 == std::set<int>{4, 5, 6, 7, 8, 9});
  CHECK(drop == std::set<int>{14, 15});
}

TEST_CASE("qevict keeps its pins for tokens that join after the compression point", "[qevict]") {
  // No recent pin: only a pinned segment keeps tokens 16 and 17 (never attended) in fp16.
  const std::string spec =
      "qevict:base=snapkv/window=1/kernel=1/pool=none,window=4,sinks=0,recent=0,group=32,bits=4,retier=2";
  const FakeSignals s = example();
  const auto question = fp16_after_retier(spec, s, 2);  // query-agnostic: the question arrives later
  CHECK(question.count(16) == 1);
  CHECK(question.count(17) == 1);
  const auto context = fp16_after_retier(spec, s, 1);
  CHECK(context.count(16) == 0);
  CHECK(context.count(17) == 0);
  const auto generated = fp16_after_retier(spec + ",pin=generated", s, 3);
  CHECK(generated.count(16) == 1);
  CHECK(generated.count(17) == 1);
}

TEST_CASE("qevict's decode scores do not depend on the base score's scale", "[qevict]") {
  // Window sums over 32 rows or one: the prompt's scores join the decode attention in one unit.
  const std::string spec = kBase + ",bits=4,retier=2";
  FakeSignals scaled = example();
  for (auto& x : scaled.window_[0].data) x *= 32.0f;
  // The attention goes to token 4, whose window [4-7] scored below [8,9] in the prompt: counted
  // in one unit it now leads; had the prompt's scores kept their own scale (x 32), [8,9] would.
  for (const char* extra : {"", ",hi_share=1"}) {
    INFO(extra);
    const auto plain = after_retier(spec + extra, example(), 1, 4);
    CHECK(plain == after_retier(spec + extra, scaled, 1, 4));
    CHECK(plain.at(8) != TokenCodec::Fp16);
  }
}

TEST_CASE("qevict rejects bad parameters, naming them", "[qevict]") {
  CHECK_THROWS_WITH(PolicyRegistry::instance().create("qevict:hi_share=1.5"), Catch::Contains("'hi_share' = 1.5"));
  CHECK_THROWS_WITH(PolicyRegistry::instance().create("qevict:bits=3"), Catch::Contains("bits = 3"));
  CHECK_THROWS_WITH(PolicyRegistry::instance().create("qevict:pin=docs"), Catch::Contains("segment 'docs'"));
  CHECK_THROWS_WITH(PolicyRegistry::instance().create("qevict:base=h2o"), Catch::Contains("'base' = 'h2o'"));
}
