// The plan API (kvcache/plan_apply.h) that replay and live verify share: plans checked, keep
// lists applied, decode-time evictions and re-tiers, bytes, each mirrored onto a row sink.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "kvcache/config.h"
#include "kvcache/plan_apply.h"
#include "policies/registry.h"

using namespace kvsim;
using kvcache::LayerIndex;

namespace {

ReplayConfig config_of(const std::string& spec, double budget) {
  PolicyInstance inst = PolicyRegistry::instance().create(spec);
  return {inst.name, inst.params, std::shared_ptr<const Policy>(std::move(inst.policy)), budget};
}

ModelGeometry geometry(int q_heads, int kv_heads) {
  ModelGeometry g;
  g.n_layers = 1, g.n_q_heads = q_heads, g.n_kv_heads = kv_heads, g.head_dim = 8;
  return g;
}

HeadPlan plan_of(const std::string& codes) {  // '.' drop, 'f' fp16, '4' int4
  HeadPlan p;
  for (char ch : codes)
    p.codec.push_back(ch == '.' ? TokenCodec::Drop : ch == '4' ? TokenCodec::Int4 : TokenCodec::Fp16);
  return p;
}

// Records what the manager asks of the rows.
struct RecordingRows final : kvcache::RowSink {
  std::vector<std::vector<std::vector<std::int32_t>>> keeps;
  std::vector<std::pair<int, std::vector<std::int32_t>>> evictions;
  std::vector<int> encoded;
  void keep(const std::vector<std::vector<std::int32_t>>& k) override { keeps.push_back(k); }
  void evict(int entry, std::span<const std::int32_t> t) override {
    evictions.emplace_back(entry, std::vector(t.begin(), t.end()));
  }
  void encode(int entry, const HeadPlan&) override { encoded.push_back(entry); }
  std::vector<std::pair<int, std::vector<float>>> biases;
  void bias(int entry, std::vector<float> b) override { biases.emplace_back(entry, std::move(b)); }
};

using Tokens = std::vector<std::int32_t>;

}  // namespace

TEST_CASE("compression cuts: every N prompt tokens, then the compression point", "[kvcache]") {
  CHECK(compression_cuts(700, 256) == std::vector<std::int64_t>{256, 512, 700});
  CHECK(compression_cuts(512, 256) == std::vector<std::int64_t>{256, 512});
  CHECK(compression_cuts(700, 0) == std::vector<std::int64_t>{700});
  CHECK(compression_cuts(100, 256) == std::vector<std::int64_t>{100});
  CHECK_THROWS_WITH(compression_cuts(100, -1), Catch::Contains("--compress-every must be >= 0"));
}

TEST_CASE("plans are checked against the cache they were made for", "[kvcache]") {
  const ReplayConfig cfg = config_of("streamingllm", 0.5);
  const ModelGeometry g = geometry(4, 2);
  const std::vector<std::int64_t> cached{3, 3};
  LayerPlan plan{{plan_of("ff."), plan_of(".ff")}};
  CHECK_FALSE(kvcache::check_plan(cfg, plan, cached, g));
  plan.heads.push_back(plan_of("fff"));
  CHECK_THROWS_WITH(kvcache::check_plan(cfg, plan, cached, g),
                    Catch::Contains("policy streamingllm: plan has 3 heads, expected 2 (one per KV head) or 4"));
  plan.heads.push_back(plan_of("fff"));
  CHECK(kvcache::check_plan(cfg, plan, cached, g));  // one per query head
  LayerPlan short_plan{{plan_of("ff"), plan_of("fff")}};
  CHECK_THROWS_WITH(kvcache::check_plan(cfg, short_plan, cached, g),
                    Catch::Contains("plan covers 2 tokens, expected 3"));
  LayerPlan coded{{plan_of("f4f"), plan_of("fff")}};
  CHECK_THROWS_WITH(kvcache::check_plan(cfg, coded, cached, g), Catch::Contains("names no codec"));
  CHECK_FALSE(kvcache::check_plan(config_of("intn", 0.5), coded, cached, g));
  // Encoded tokens live in one entry per KV head, in replay and live alike.
  LayerPlan coded_per_query_head{{plan_of("f4f"), plan_of("fff"), plan_of("fff"), plan_of("fff")}};
  CHECK_THROWS_WITH(kvcache::check_plan(config_of("intn", 0.5), coded_per_query_head, cached, g),
                    Catch::Contains("plans with encoded tokens must have one entry per KV head"));
}

TEST_CASE("applying a plan keeps each entry's tokens and mirrors it onto the rows", "[kvcache]") {
  const ModelGeometry g = geometry(4, 2);
  RecordingRows rows;
  SECTION("eviction: kept tokens, encoding left implicit, nothing encoded") {
    LayerIndex cache = LayerIndex::prefix(2, 4);
    kvcache::apply_plan(config_of("streamingllm", 0.5), LayerPlan{{plan_of("f..f"), plan_of("ff..")}}, g, cache, &rows);
    CHECK(cache.tokens == std::vector<Tokens>{{0, 3}, {0, 1}});
    CHECK(cache.encoding[0].codec.empty());
    REQUIRE(rows.keeps.size() == 1);
    CHECK(rows.keeps[0] == cache.tokens);
    CHECK(rows.encoded.empty());
  }
  SECTION("per query head: each query head gets its own entry") {
    LayerIndex cache = LayerIndex::prefix(2, 3);
    kvcache::apply_plan(config_of("snapkv:gqa=per_query_head", 0.5),
                        LayerPlan{{plan_of("f.f"), plan_of("ff."), plan_of(".ff"), plan_of("f..")}}, g, cache, &rows);
    CHECK(cache.tokens == std::vector<Tokens>{{0, 2}, {0, 1}, {1, 2}, {0}});
  }
  SECTION("a codec: the encoding is kept as planned, only encoded entries re-encoded") {
    LayerIndex cache = LayerIndex::prefix(2, 3);
    kvcache::apply_plan(config_of("intn", 0.5), LayerPlan{{plan_of("4.f"), plan_of("fff")}}, g, cache, &rows);
    CHECK(cache.tokens == std::vector<Tokens>{{0, 2}, {0, 1, 2}});
    CHECK(cache.encoding[0].codec.size() == 3);  // as planned, its Drop included
    CHECK(rows.encoded == std::vector<int>{0});
  }
  SECTION("logit biases (a soft-gated run): the kept tokens' biases reach the rows; offline they are refused") {
    LayerIndex cache = LayerIndex::prefix(2, 3);
    LayerPlan plan{{plan_of("f.f"), plan_of("fff")}};
    plan.heads[0].logit_bias = {-0.5f, -9.0f, -0.1f};
    kvcache::apply_plan(config_of("streamingllm", 0.5), plan, g, cache, &rows);
    REQUIRE(rows.biases.size() == 1);
    CHECK(rows.biases[0].first == 0);
    CHECK(rows.biases[0].second == std::vector<float>{-0.5f, -0.1f});  // the dropped token's bias left out
    LayerIndex offline = LayerIndex::prefix(2, 3);
    CHECK_THROWS_WITH(kvcache::apply_plan(config_of("streamingllm", 0.5), plan, g, offline, nullptr),
                      Catch::Contains("offline replay does not score"));
    plan.heads[1].logit_bias = {0.0f};
    CHECK_THROWS_WITH(kvcache::check_plan(config_of("streamingllm", 0.5), plan, {3, 3}, g),
                      Catch::Contains("1 logit biases; expected one per token"));
  }
}

TEST_CASE("decode-time evictions: tokens leave, the budget is held, bad evictions are refused", "[kvcache]") {
  LayerIndex cache = LayerIndex::prefix(2, 4);
  kvcache::append_token(cache, 4);
  CHECK(cache.tokens[1] == Tokens{0, 1, 2, 3, 4});
  CHECK(cache.encoding[1].codec.empty());  // implicit fp16 stays implicit
  RecordingRows rows;
  kvcache::apply_evictions("h2o", {{1, 2}, {0}}, 4, 4, cache, &rows);
  CHECK(cache.tokens == std::vector<Tokens>{{0, 3, 4}, {1, 2, 3, 4}});
  REQUIRE(rows.evictions.size() == 2);
  CHECK(rows.evictions[0] == std::pair<int, Tokens>{0, {1, 2}});
  CHECK_THROWS_WITH(kvcache::apply_evictions("h2o", {{1}, {}}, 5, 4, cache, nullptr),
                    Catch::Contains("policy h2o: evicted token 1 that is not in the cache"));
  LayerIndex full = LayerIndex::prefix(1, 5);
  CHECK_THROWS_WITH(kvcache::apply_evictions("tova", {{0}}, 7, 3, full, nullptr),
                    Catch::Contains("cache holds 4 tokens after step 7, over its budget of 3"));
  // One list per entry: a short answer would skip the budget check of the entries it leaves out.
  CHECK_THROWS_WITH(kvcache::apply_evictions("h2o", {{3}}, 5, 4, cache, nullptr),
                    Catch::Contains("evicted from 1 cache entries, expected 2"));
}

TEST_CASE("listed encodings follow their tokens through appends and evictions", "[kvcache]") {
  LayerIndex cache;
  cache.tokens = {{0, 2, 5}};
  cache.encoding = {plan_of("4.4f")};  // token 0 int4, (dropped), token 2 int4, token 5 fp16
  cache.listed = true;
  kvcache::append_token(cache, 6);
  CHECK(cache.encoding[0].codec.size() == 5);
  kvcache::apply_evictions("qevict", {{2}}, 6, -1, cache, nullptr);
  CHECK(cache.tokens[0] == Tokens{0, 5, 6});
  CHECK(cache.encoding[0].codec ==
        std::vector<TokenCodec>{TokenCodec::Int4, TokenCodec::Drop, TokenCodec::Fp16, TokenCodec::Fp16});
}

TEST_CASE("re-tiering re-encodes the kept tokens within the entry's byte budget", "[kvcache]") {
  const ReplayConfig cfg = config_of("intn", 0.5);
  const KvCodec& codec = *cfg.impl->codec();
  const int d = 8;
  LayerIndex cache = LayerIndex::prefix(1, 4);
  RecordingRows rows;
  const LayerPlan next{{plan_of("4.f4")}};
  kvcache::apply_retier("qevict", next, 2, 9, codec, 1e9, d, cache, &rows);
  CHECK(cache.tokens[0] == Tokens{0, 2, 3});
  CHECK(cache.encoding[0].codec == std::vector<TokenCodec>{TokenCodec::Int4, TokenCodec::Fp16, TokenCodec::Int4});
  CHECK(rows.keeps.size() == 1);
  CHECK(rows.encoded == std::vector<int>{0});
  const double fp16 = codec_token_bytes(TokenCodec::Fp16, d);
  LayerIndex again = LayerIndex::prefix(1, 4);
  CHECK_THROWS_WITH(
      kvcache::apply_retier("qevict", LayerPlan{{plan_of("ffff")}}, 2, 9, codec, 3 * fp16, d, again, nullptr),
      Catch::Contains("re-tiered cache of layer 2, KV head 0 holds") && Catch::Contains("after step 9"));
  CHECK_THROWS_WITH(kvcache::apply_retier("qevict", LayerPlan{{plan_of("ff")}}, 2, 9, codec, 1e9, d, again, nullptr),
                    Catch::Contains("re-tier plan covers 2 tokens, expected 4"));
}

TEST_CASE("a cut's plan widens to the prompt, and earlier cuts apply only their drops", "[kvcache]") {
  LayerIndex cache;
  cache.tokens = {{0, 3, 4}};
  cache.encoding = {HeadPlan{}};
  const LayerPlan cut{{plan_of("4.f")}};
  const LayerPlan wide = kvcache::widen_plan(cut, cache, 6);
  CHECK(wide.heads[0].codec == plan_of("4...f.").codec);
  const LayerPlan drops = kvcache::drops_only(cut);
  CHECK(drops.heads[0].codec == plan_of("f.f").codec);
}

TEST_CASE("layer bytes: rows at the budget's token bytes, less what a codec saves", "[kvcache]") {
  const int d = 8;
  const ReplayConfig evict = config_of("h2o", 0.5);
  const ConfigBudget b = config_budget(*evict.impl, 0.5, 8, d);
  LayerIndex cache = LayerIndex::prefix(2, 3);
  CHECK(kvcache::layer_bytes(cache, b, nullptr, d) == Approx(cache_bytes(b, 6, 2, 1)));
  const ReplayConfig coded = config_of("intn", 0.5);
  const ConfigBudget cb = config_budget(*coded.impl, 0.5, 8, d);
  kvcache::apply_plan(coded, LayerPlan{{plan_of("444"), plan_of("fff")}}, geometry(2, 2), cache, nullptr);
  const double saving = kvcache::codec_bytes(*coded.impl->codec(), cache, d).saving;
  CHECK(saving > 0);
  // A layer no codec planned is fp16 whatever the policy's codec would claim for it.
  CHECK(kvcache::codec_bytes(*coded.impl->codec(), LayerIndex::prefix(2, 3), d).saving == 0);
  CHECK(kvcache::layer_bytes(cache, cb, coded.impl->codec(), d) == Approx(cache_bytes(cb, 6, 2, 1) - saving));
}

TEST_CASE("peak-matched budgets leave each kind of policy its headroom below the budget", "[kvcache]") {
  const int d = 64;
  const double kv = 4.0 * d;  // fp16 K and V of one token
  // Point semantics: the budget is what the compression point keeps.
  const ConfigBudget point = config_budget(*config_of("snapkv", 0.25).impl, 0.25, 1000, d);
  CHECK(point.tokens == 250);
  CHECK(point.peak_tokens == 0);
  CHECK(point.fraction == 0.25);
  CHECK(point.rows_after_step() == 250);
  // A one-shot policy compresses `every` tokens below the budget and re-applies when it is full.
  const BudgetRule rule = parse_budget_rule("peak", 32);
  CHECK(rule.name() == "peak/32");
  const ConfigBudget shot = config_budget(*config_of("snapkv", 0.25).impl, 0.25, 1000, d, rule, "snapkv");
  CHECK(shot.peak_tokens == 250);
  CHECK(shot.tokens == 218);
  CHECK(shot.reapply_every == 32);
  CHECK(shot.peak_entry_bytes == Approx(250 * kv));
  CHECK(shot.fraction * 1000 * kv == Approx(218 * kv));
  CHECK(shot.rows_after_step() == -1);  // the layer as a whole is held (budgets may move between heads)
  // ... at most half the budget.
  const ConfigBudget tight = config_budget(*config_of("snapkv", 0.02).impl, 0.02, 1000, d, rule, "snapkv");
  CHECK(tight.peak_tokens == 20);
  CHECK(tight.tokens == 10);
  // A policy that evicts every step needs room for the token that joins before it evicts.
  const ConfigBudget step = config_budget(*config_of("h2o", 0.25).impl, 0.25, 1000, d, rule, "h2o");
  CHECK(step.tokens == step.peak_tokens - 1);
  CHECK(step.reapply_every == 0);
  CHECK(step.rows_after_step() == step.peak_tokens - 1);
  // QEvict grows by its re-tier interval in fp16 (and its score state counts in every token).
  const ConfigBudget tiers = config_budget(*config_of("qevict:retier=16", 0.25).impl, 0.25, 1000, d, rule, "qevict");
  CHECK(tiers.tokens == tiers.peak_tokens - 16);
  CHECK(tiers.token_bytes > kv);
  CHECK_THROWS_WITH(config_budget(*config_of("qevict", 0.1).impl, 0.1, 1000, d, rule, "qevict"),
                    Catch::Contains("qevict:retier="));
  // The full cache is no config to hold; selections made once for every layer cannot re-apply.
  CHECK(config_budget(*config_of("full", 1.0).impl, 1.0, 1000, d, rule).peak_tokens == 0);
  CHECK_THROWS_WITH(config_budget(*config_of("kvzip_proxy", 0.25).impl, 0.25, 1000, d, rule, "kvzip_proxy"),
                    Catch::Contains("level=layer"));
  CHECK_THROWS_WITH(config_budget(*config_of("kvzip:level=layer", 0.25).impl, 0.25, 1000, d, rule, "kvzip"),
                    Catch::Contains("reconstruction pass"));
  CHECK_THROWS_WITH(parse_budget_rule("always", 32), Catch::Contains("expected point or peak"));
  CHECK_THROWS_WITH(parse_budget_rule("peak", 0), Catch::Contains("--reapply-every"));
}
