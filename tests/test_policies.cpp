// Each policy on a worked example small enough to compute by hand: the exact keep-set.
#include <catch2/catch.hpp>

#include <cmath>
#include <set>

#include "core/error.h"
#include "fake_signals.h"
#include "policies/registry.h"
#include "policies/selection.h"
#include "traces/trace_schema.h"

using namespace kvsim;
using test::FakeSignals;

namespace {

std::set<int> kept(const HeadPlan& p) {
  std::set<int> s;
  for (std::size_t j = 0; j < p.codec.size(); ++j)
    if (p.codec[j] != TokenCodec::Drop) s.insert(static_cast<int>(j));
  return s;
}

LayerPlan run(const std::string& spec, const LayerSignals& s, std::int64_t budget) {
  return PolicyRegistry::instance().create(spec).policy->compress(s, Budget{budget, 0.5});
}

// A reconstruction pass of one chunk repeating context tokens [begin, end) in `rows` rows.
RepeatPassView one_chunk(std::int64_t begin, std::int64_t end, std::int64_t rows, const std::vector<float>& q,
                         const std::vector<float>& k) {
  RepeatPassView rp;
  rp.chunks = {{begin, end, 0, rows}};
  rp.rows = rows;
  rp.q = q.data();
  rp.k = k.data();
  return rp;
}

}  // namespace

TEST_CASE("top-k keeps protected tokens first and breaks ties toward the recent token", "[policy]") {
  const std::vector<float> score = {0.3f, 0.6f, 0.3f, 0.2f, 0.2f, 0.0f};
  CHECK(top_k_mask(score, 2) == std::vector<std::uint8_t>{0, 1, 1, 0, 0, 0});  // 0 and 2 tie: 2 wins
  const std::vector<std::uint8_t> prot = {0, 0, 0, 0, 0, 1};
  CHECK(top_k_mask(score, 2, prot) == std::vector<std::uint8_t>{0, 1, 0, 0, 0, 1});
  // More protected tokens than budget: the most recent protected ones stay.
  CHECK(top_k_mask(score, 1, std::vector<std::uint8_t>{1, 1, 0, 0, 0, 0}) ==
        std::vector<std::uint8_t>{0, 1, 0, 0, 0, 0});
  CHECK(top_k_mask(score, 0) == std::vector<std::uint8_t>(6, 0));
  CHECK(top_k_mask(score, 99) == std::vector<std::uint8_t>(6, 1));
}

TEST_CASE("pooling pads like PyTorch: avg counts zero padding, max ignores it", "[policy]") {
  const std::vector<float> x = {0.3f, 0.6f, 0.3f, 0.2f};
  const auto avg = pool1d(x, 3, PoolKind::Avg);
  CHECK(avg[0] == Approx(0.3));  // (0 + 0.3 + 0.6) / 3
  CHECK(avg[1] == Approx(0.4));
  CHECK(avg[3] == Approx((0.3 + 0.2) / 3));
  const auto mx = pool1d(x, 3, PoolKind::Max);
  CHECK(mx == std::vector<float>{0.6f, 0.6f, 0.6f, 0.3f});
}

TEST_CASE("full keeps everything; random keeps exactly the budget, reproducibly", "[policy]") {
  FakeSignals s(2, 2, 50, 3, 8);
  CHECK(kept(run("full", s, 5).heads[1]).size() == 50);
  const auto a = run("random:seed=1", s, 12), b = run("random:seed=1", s, 12), c = run("random:seed=2", s, 12);
  CHECK(kept(a.heads[0]).size() == 12);
  CHECK(kept(a.heads[0]) == kept(b.heads[0]));
  CHECK(kept(a.heads[0]) != kept(c.heads[0]));
  CHECK(kept(a.heads[0]) != kept(a.heads[1]));
}

TEST_CASE("streamingllm keeps sinks and the most recent tokens", "[policy]") {
  FakeSignals s(1, 1, 10);
  CHECK(kept(run("streamingllm:sinks=2", s, 5).heads[0]) == std::set<int>{0, 1, 7, 8, 9});
  CHECK(kept(run("streamingllm", s, 6).heads[0]) == std::set<int>{0, 1, 2, 3, 8, 9});
}

TEST_CASE("snapkv: window votes, pooling, tie rule, GQA aggregation", "[policy]") {
  FakeSignals s(1, 1, 8);
  s.window_[0] = {{0.1f, 0.5f, 0.0f, 0.2f, 0.1f, 0.0f, 0.1f, 0.0f}, {0.2f, 0.1f, 0.3f, 0.0f, 0.1f, 0.0f, 0.1f, 0.2f}};
  // Column sums [0.3 0.6 0.3 0.2 0.2 0 0.2 0.2]; window {6, 7} protected; 0 and 2 tie: 2 is newer.
  CHECK(kept(run("snapkv:window=2,kernel=1,pool=none", s, 4).heads[0]) == std::set<int>{1, 2, 6, 7});
  // avg-pooled (kernel 3): [0.3 0.4 0.367 0.233 0.133 0.133 ...]
  CHECK(kept(run("snapkv:window=2,kernel=3,pool=avg", s, 4).heads[0]) == std::set<int>{1, 2, 6, 7});
  CHECK(kept(run("snapkv:window=2,kernel=3,pool=avg", s, 5).heads[0]) == std::set<int>{0, 1, 2, 6, 7});

  // Pooling covers the prefix only: the window's strong self-attention (token 6) must not lift
  // its neighbour (token 5). Sums [.3 .3 0 0 0 0 1.2 .2]; pooled prefix [.2 .2 .1 0 0 0].
  FakeSignals b(1, 1, 8);
  b.window_[0] = {{0.2f, 0.2f, 0, 0, 0, 0, 0.6f, 0}, {0.1f, 0.1f, 0, 0, 0, 0, 0.6f, 0.2f}};
  CHECK(kept(run("snapkv:window=2,kernel=3,pool=avg", b, 3).heads[0]) == std::set<int>{1, 6, 7});

  FakeSignals g(2, 1, 5);  // one KV head shared by two query heads
  g.window_[0] = {{0.45f, 0.0f, 0.0f, 0.35f, 0.2f}};
  g.window_[1] = {{0.0f, 0.0f, 0.1f, 0.3f, 0.6f}};
  CHECK(kept(run("snapkv:window=1,kernel=1,pool=none,gqa=mean", g, 2).heads[0]) == std::set<int>{3, 4});
  CHECK(kept(run("snapkv:window=1,kernel=1,pool=none,gqa=max", g, 2).heads[0]) == std::set<int>{0, 4});
}

TEST_CASE("pyramidkv gives low layers more, with the mean at the budget", "[policy]") {
  // n=100, budget 30, window 4, 4 layers, beta 20: base 26, caps 51 35 19 3 (sum 108 > 104),
  // trimmed by one each -> 50 34 18 2, plus the window.
  std::vector<std::int64_t> counts;
  for (int layer = 0; layer < 4; ++layer) {
    FakeSignals s(1, 1, 100, layer, 4);
    test::Rows w;
    w.rows = 4;
    w.cols = 100;
    w.data.assign(400, 0.01f);
    s.window_[0] = w;
    counts.push_back(static_cast<std::int64_t>(kept(run("pyramidkv:window=4", s, 30).heads[0]).size()));
  }
  CHECK(counts == std::vector<std::int64_t>{54, 38, 22, 6});
}

TEST_CASE("adakv shares a layer's budget across heads with a floor", "[policy]") {
  FakeSignals s(2, 2, 6);
  s.window_[0] = {{0.05f, 0.05f, 0.6f, 0.1f, 0.1f, 0.1f}};
  s.window_[1] = {{0.2f, 0.2f, 0.15f, 0.15f, 0.1f, 0.2f}};
  // Share 2 per head beyond the window; global top 4 = h0:2, h1:1, h1:0, h1:3 -> won 1 and 3;
  // caps round(0.8*won + 0.2*2) = 1 and 3.
  const auto plan = run("adakv:base=snapkv/window=1/kernel=1/pool=none,alpha=0.2", s, 3);
  CHECK(kept(plan.heads[0]) == std::set<int>{2, 5});
  CHECK(kept(plan.heads[1]) == std::set<int>{0, 1, 3, 5});
  // alpha = 1 is the uniform split.
  const auto uniform = run("adakv:base=snapkv/window=1/kernel=1/pool=none,alpha=1", s, 3);
  CHECK(kept(uniform.heads[0]) == std::set<int>{2, 4, 5});
  CHECK_THROWS_WITH(run("adakv:base=keydiff", s, 3), Catch::Contains("is not a scoring policy"));
}

TEST_CASE("h2o keeps heavy hitters by accumulated attention plus recent tokens", "[policy]") {
  FakeSignals s(1, 1, 5);
  s.observed_[0] = {{1, 0, 0, 0, 0},
                    {0.5f, 0.5f, 0, 0, 0},
                    {0.2f, 0.6f, 0.2f, 0, 0},
                    {0.1f, 0.1f, 0.1f, 0.7f, 0},
                    {0.3f, 0.1f, 0.2f, 0.2f, 0.2f}};
  // Sums [2.1 1.3 0.5 0.9 0.2]; recent = floor(0.5*3) = 1.
  CHECK(kept(run("h2o", s, 3).heads[0]) == std::set<int>{0, 1, 4});
  // Normalised by how many queries saw each token: [0.42 0.325 0.167 0.45 0.2].
  CHECK(kept(run("h2o:normalize=true,phase=prefill", s, 3).heads[0]) == std::set<int>{0, 3, 4});
}

TEST_CASE("tova uses the last query averaged over all heads, one set for every KV head", "[policy]") {
  FakeSignals s(2, 2, 5);
  s.window_[0] = {{0.1f, 0.4f, 0.1f, 0.2f, 0.2f}};
  s.window_[1] = {{0.5f, 0.0f, 0.1f, 0.2f, 0.2f}};
  // Mean [0.3 0.2 0.1 0.2 0.2]; last token protected; 1 and 3 tie: 3 is newer.
  const auto plan = run("tova", s, 3);
  CHECK(kept(plan.heads[0]) == std::set<int>{0, 3, 4});
  CHECK(kept(plan.heads[1]) == std::set<int>{0, 3, 4});
}

TEST_CASE("keydiff keeps the most distinctive keys, one-shot or block by block", "[policy]") {
  FakeSignals s(1, 1, 5);
  s.keys_[0] = {{1, 0}, {1, 0.1f}, {0, 1}, {1, -0.1f}, {-1, 0}};
  CHECK(kept(run("keydiff:block=0", s, 2).heads[0]) == std::set<int>{2, 4});
  CHECK(kept(run("keydiff:block=0", s, 3).heads[0]) == std::set<int>{2, 3, 4});
  // Blocks of 2: {0,1} -> {0,1,2,3} cut to {2,3} -> {2,3,4} cut to {3,4}.
  CHECK(kept(run("keydiff:block=2", s, 2).heads[0]) == std::set<int>{3, 4});
  // Budget below the block: the first token alone, then {0,1,2} -> {2}, then {2,3,4} -> {3}.
  CHECK(kept(run("keydiff:block=2", s, 1).heads[0]) == std::set<int>{3});
}

TEST_CASE("oracle_future keeps what the future queries attend to", "[policy]") {
  FakeSignals s(2, 2, 4);
  s.future_[0] = {{0.5f, 0.1f, 0.1f, 0.3f}, {0.3f, 0.1f, 0.2f, 0.4f}};
  s.future_[1] = {{0.1f, 0.1f, 0.1f, 0.7f}, {0.1f, 0.1f, 0.1f, 0.7f}};
  auto plan = run("oracle_future", s, 2);
  CHECK(kept(plan.heads[0]) == std::set<int>{0, 3});
  CHECK(kept(plan.heads[1]) == std::set<int>{2, 3});  // ties at 0.2: the newest wins
  // alloc=layer: global top 4 of the layer = h1:3, h0:0, h0:3, h0:2.
  plan = run("oracle_future:alloc=layer", s, 2);
  CHECK(kept(plan.heads[0]) == std::set<int>{0, 2, 3});
  CHECK(kept(plan.heads[1]) == std::set<int>{3});
}

TEST_CASE("the registry rejects unknown policies and parameters, naming the valid ones", "[policy]") {
  auto& reg = PolicyRegistry::instance();
  CHECK_THROWS_WITH(reg.create("snapkvv"), Catch::Contains("unknown policy 'snapkvv'") && Catch::Contains("snapkv"));
  CHECK_THROWS_WITH(reg.create("snapkv:windw=3"),
                    Catch::Contains("unknown parameter 'windw'") && Catch::Contains("window"));
  CHECK_THROWS_WITH(reg.create("snapkv:window=abc"), Catch::Contains("'window' = 'abc', expected an integer"));
  CHECK_THROWS_WITH(reg.create("snapkv:pool=median"), Catch::Contains("expected avg | max | none"));
  CHECK_THROWS_WITH(reg.create("snapkv:window"), Catch::Contains("is not key=value"));
  CHECK(reg.create("snapkv:kernel=7").params == "window=32,kernel=7,pool=avg,gqa=mean");
  for (const PolicyInfo* p : reg.all()) {
    INFO(p->name);
    CHECK_FALSE(p->description.empty());
    CHECK_FALSE(p->citation.empty());
  }
}

TEST_CASE("tables name a learned policy's model file by its file name", "[policy]") {
  CHECK(table_label("foresight:model=out/a/query-aware/f.h5,sinks=2") == "foresight:model=f.h5,sinks=2");
  CHECK(table_label("rlkv:model=r.h5") == "rlkv:model=r.h5");
  CHECK(table_label("snapkv:window=64") == "snapkv:window=64");
}

TEST_CASE("a policy alias selects the policy under its canonical name", "[policy]") {
  auto& reg = PolicyRegistry::instance();
  const PolicyInstance inst = reg.create("lowrank_uniform:sinks=2");
  CHECK(inst.name == "lowrank");
  CHECK(inst.params == reg.create("lowrank:sinks=2").params);
  CHECK(reg.find("lowrank_uniform").name == "lowrank");
  CHECK(reg.aliases_of("lowrank") == std::vector<std::string>{"lowrank_uniform"});
  CHECK(reg.aliases_of("snapkv").empty());
  CHECK_THROWS_WITH(reg.create("lowrank_uniform:rank=3"), Catch::Contains("unknown parameter 'rank'"));
  CHECK_THROWS_WITH(reg.create("lowrank_uniformm"), Catch::Contains("aliases: lowrank_uniform = lowrank"));
  CHECK_THROWS_WITH(reg.add_alias("snapkv", "h2o"), Catch::Contains("is the name of a policy"));
  CHECK_THROWS_WITH(reg.add_alias("lowrank_uniform", "h2o"), Catch::Contains("registered twice"));
  // An alias of an alias (or of nothing) is refused when used, never followed round a cycle.
  reg.add_alias("test_alias_of_alias", "lowrank_uniform");
  CHECK_THROWS_WITH(reg.create("test_alias_of_alias"),
                    Catch::Contains("names 'lowrank_uniform', which is not a policy"));
}

TEST_CASE("expected_attention scores keys by expected attention of the mean query times |v|", "[policy]") {
  FakeSignals s(1, 1, 5);  // head_dim 2, no rotary dims: the mean rotation is the identity
  s.queries_[0] = {{9, 9}, {1, 0}, {1, 0}, {3, 0}, {3, 0}};  // row 0 is a sink: left out, mean (2, 0)
  s.keys_[0] = {{0, 0}, {1, 0}, {0, 1}, {-1, 0}, {2, 0}};
  s.values_[0] = {{1, 0}, {1, 0}, {0, 3}, {1, 0}, {0.1f, 0}};
  // z = mu.k / sqrt(2): [., 1.41, 0, -1.41, 2.83] -> p = [., .185, .045, .011, .76]; x |v| = [., .185, .135, .011,
  // .076]
  CHECK(kept(run("expected_attention:sinks=1,covariance=false", s, 2).heads[0]) == std::set<int>{0, 1});
  CHECK(kept(run("expected_attention:sinks=1,covariance=false", s, 3).heads[0]) == std::set<int>{0, 1, 2});
  CHECK(kept(run("expected_attention:sinks=1,covariance=false,vnorm=false", s, 2).heads[0]) == std::set<int>{0, 4});
}

TEST_CASE("oracle_golden keeps by the best block, oracle_future by the total", "[policy]") {
  FakeSignals s(1, 1, 3);
  s.future_[0] = {{0.0f, 0.9f, 0.1f}, {0.6f, 0.1f, 0.3f}, {0.0f, 0.5f, 0.5f}};
  // Block maxima [0.6 0.9 0.5] vs sums [0.6 1.5 0.9].
  CHECK(kept(run("oracle_golden:block=1", s, 2).heads[0]) == std::set<int>{0, 1});
  CHECK(kept(run("oracle_future", s, 2).heads[0]) == std::set<int>{1, 2});
  CHECK(kept(run("oracle_golden:block=3", s, 2).heads[0]) == std::set<int>{1, 2});  // one block: the mean
}

namespace {
std::vector<std::vector<std::int32_t>> step(DecodeState& state, std::int64_t token,
                                            const std::vector<std::vector<std::int32_t>>& cache,
                                            const std::vector<std::vector<float>>& weights, std::int64_t budget) {
  std::vector<std::vector<std::int32_t>> evict(cache.size());
  state.step(DecodeStep{token, cache, weights, budget}, evict);
  return evict;
}
}  // namespace

TEST_CASE("decode-time h2o keeps accumulating renormalised attention and evicts outside the recent window",
          "[policy]") {
  FakeSignals s(1, 1, 5);
  s.observed_[0] = {{1, 0, 0, 0, 0},
                    {0.5f, 0.5f, 0, 0, 0},
                    {0.2f, 0.6f, 0.2f, 0, 0},
                    {0.1f, 0.1f, 0.1f, 0.7f, 0},
                    {0.3f, 0.1f, 0.2f, 0.2f, 0.2f}};
  const auto inst = PolicyRegistry::instance().create("h2o");
  const LayerPlan plan = inst.policy->compress(s, Budget{3, 0.5});
  REQUIRE(kept(plan.heads[0]) == std::set<int>{0, 1, 4});  // scores 2.1, 1.3, 0.2
  auto state = inst.policy->start_decode(s, plan, Budget{3, 0.5});
  REQUIRE(state);
  // Step 5: scores 2.2 1.8 0.3 | 0.3 (newest, protected): token 4 goes.
  CHECK(step(*state, 5, {{0, 1, 4, 5}}, {{0.1f, 0.5f, 0.1f, 0.3f}}, 3)[0] == std::vector<std::int32_t>{4});
  // Step 6: scores 2.3 1.9 1.0 | 0.1: token 5 goes, although 6 has the lowest score.
  CHECK(step(*state, 6, {{0, 1, 5, 6}}, {{0.1f, 0.1f, 0.7f, 0.1f}}, 3)[0] == std::vector<std::int32_t>{5});
  CHECK_FALSE(PolicyRegistry::instance().create("h2o:phase=prefill").policy->start_decode(s, plan, Budget{3, 0.5}));
}

TEST_CASE("decode-time tova drops the token with the lowest mean attention, one set per layer", "[policy]") {
  FakeSignals s(2, 2, 5);
  const auto inst = PolicyRegistry::instance().create("tova");
  auto state = inst.policy->start_decode(s, LayerPlan{}, Budget{3, 0.5});
  REQUIRE(state);
  // Sums [0.375 0.375 0.75 0.5] (exact in binary): 0 and 2 tie, the older (0) goes, from both heads.
  const auto evict = step(*state, 7, {{0, 2, 3, 7}, {0, 2, 3, 7}},
                          {{0.125f, 0.25f, 0.375f, 0.25f}, {0.25f, 0.125f, 0.375f, 0.25f}}, 3);
  CHECK(evict[0] == std::vector<std::int32_t>{0});
  CHECK(evict[1] == std::vector<std::int32_t>{0});
}

TEST_CASE("decode-time streamingllm drops the oldest tokens past the sinks", "[policy]") {
  FakeSignals s(1, 1, 5);
  auto state =
      PolicyRegistry::instance().create("streamingllm:sinks=2").policy->start_decode(s, LayerPlan{}, Budget{3, 0.5});
  REQUIRE(state);
  CHECK(step(*state, 7, {{0, 1, 5, 6, 7}}, {{0.2f, 0.2f, 0.2f, 0.2f, 0.2f}}, 3)[0] == std::vector<std::int32_t>{5, 6});
}

TEST_CASE("per_query_head GQA keeps one set per query head within the group's budget", "[policy]") {
  FakeSignals g(2, 1, 5);  // one KV head shared by two query heads
  g.window_[0] = {{0.45f, 0.0f, 0.0f, 0.35f, 0.2f}};
  g.window_[1] = {{0.0f, 0.0f, 0.1f, 0.3f, 0.6f}};
  // Budget 4 per KV head -> 2 per query head: each keeps the window (token 4) + its own best.
  const auto plan = run("snapkv:window=1,kernel=1,pool=none,gqa=per_query_head", g, 4);
  REQUIRE(plan.heads.size() == 2);
  CHECK(kept(plan.heads[0]) == std::set<int>{0, 4});
  CHECK(kept(plan.heads[1]) == std::set<int>{3, 4});
  CHECK_THROWS_WITH(PolicyRegistry::instance().create("h2o:gqa=per_query_head"), Catch::Contains("phase=prefill only"));
}

TEST_CASE("expected_attention inverts RoPE and averages the future rotation, both pairings", "[policy]") {
  for (RopeType type : {RopeType::Norm, RopeType::Neox}) {
    const RopeSpec rope{type, 4, 4, 100.0};
    const std::int64_t n = 6, future = 8;
    FakeSignals s(1, 1, n, 0, 1, 4);
    s.set_rope(rope);
    // Every prompt query is the same pre-RoPE vector, rotated to its position: the fitted mean
    // is that vector (no covariance), and the score uses its rotation averaged over the next
    // `future` positions, computed here by brute force.
    const std::vector<float> pre = {0.9f, -0.4f, 1.3f, 0.2f};
    test::Rows q;
    q.cols = 4;
    for (std::int64_t t = 0; t < n; ++t) {
      std::vector<float> x = pre;
      apply_rope(rope, x.data(), 1, t);
      q.data.insert(q.data.end(), x.begin(), x.end());
      ++q.rows;
    }
    s.queries_[0] = q;
    s.keys_[0] = {{0.1f, 0.2f, 0.3f, 0.4f},  {1.0f, -1.0f, 0.5f, 0.0f},  {-0.7f, 0.3f, 0.9f, -0.2f},
                  {0.4f, 0.8f, -0.6f, 1.1f}, {-1.2f, -0.3f, 0.2f, 0.6f}, {0.6f, -0.9f, -0.4f, 0.3f}};
    s.values_[0] = {{1, 0, 0, 0}, {1, 0, 0, 0}, {1, 0, 0, 0}, {1, 0, 0, 0}, {1, 0, 0, 0}, {1, 0, 0, 0}};
    std::vector<double> mean_q(4, 0.0);
    for (std::int64_t t = n; t < n + future; ++t) {
      std::vector<float> x = pre;
      apply_rope(rope, x.data(), 1, t);
      for (int k = 0; k < 4; ++k)
        mean_q[static_cast<std::size_t>(k)] += x[static_cast<std::size_t>(k)] / double(future);
    }
    std::vector<float> z(static_cast<std::size_t>(n));
    const MatrixView keys = s.keys(0);
    for (std::int64_t j = 0; j < n; ++j) {
      double dot = 0;
      for (int k = 0; k < 4; ++k) dot += mean_q[static_cast<std::size_t>(k)] * keys.at(j, k);
      z[static_cast<std::size_t>(j)] = static_cast<float>(dot / 2.0);  // / sqrt(d); softmax keeps the order
    }
    z[0] = 1e9f;  // token 0 is the sink: always kept
    const auto expect = top_k_mask(z, 3);
    const auto plan = run("expected_attention:sinks=1,covariance=false,future=8", s, 3);
    INFO(rope_type_name(type));
    CHECK(plan.heads[0].codec.size() == 6);
    for (std::size_t j = 0; j < 6; ++j) CHECK((plan.heads[0].codec[j] != TokenCodec::Drop) == (expect[j] != 0));
  }
}

TEST_CASE("andpro scores each value's attention-weighted projection on the window's output direction", "[policy]") {
  // One window query (the last token, 4) over 5 tokens with d = 2. Its output
  // o = .3 [.5 -1] + .2 [0 1] + .2 [-2 .5] + .1 [0 1.5] + .2 [0 0] = [-.25 .15], u = o / |o|.
  // Scores a_j <v_j, u>: [-.283 .103 .394 .077 x] (token 4 is the window).
  FakeSignals s(1, 1, 5);
  s.window_[0] = {{0.3f, 0.2f, 0.2f, 0.1f, 0.2f}};
  s.values_[0] = {{0.5f, -1}, {0, 1}, {-2, 0.5f}, {0, 1.5f}, {0, 0}};
  CHECK(kept(run("andpro:window=1", s, 3).heads[0]) == std::set<int>{1, 2, 4});
  CHECK(kept(run("andpro:window=1", s, 4).heads[0]) == std::set<int>{1, 2, 3, 4});
  // Token 0 pulls against the output: signed and clamped rank it last, abs second.
  CHECK(kept(run("andpro:window=1,sign=clamp", s, 3).heads[0]) == std::set<int>{1, 2, 4});
  CHECK(kept(run("andpro:window=1,sign=abs", s, 3).heads[0]) == std::set<int>{0, 2, 4});
}

TEST_CASE("structure pins system and question tokens and shares the rest by segment run", "[policy]") {
  // 10 tokens: system 0-1, context 2-7, question 8-9; snapkv (window 1, no pooling) scores the
  // context by the last query's attention.
  FakeSignals s(1, 1, 10);
  s.set_segments({0, 0, 1, 1, 1, 1, 1, 1, 2, 2});
  s.window_[0] = {{0.0f, 0.0f, 0.3f, 0.0f, 0.25f, 0.1f, 0.05f, 0.2f, 0.0f, 0.1f}};
  // Budget 6: the 4 pinned tokens (0, 1, 8, 9) + the context's top 2 (2: .3, 4: .25).
  CHECK(kept(run("structure:base=snapkv/window=1/kernel=1/pool=none", s, 6).heads[0]) ==
        std::set<int>{0, 1, 2, 4, 8, 9});
  // Pinned tokens beyond the budget: the most recent of them.
  CHECK(kept(run("structure:base=snapkv/window=1/kernel=1/pool=none", s, 3).heads[0]) == std::set<int>{1, 8, 9});
  CHECK_THROWS_WITH(run("structure:pin=system/docs", s, 3), Catch::Contains("segment 'docs'"));
}

TEST_CASE("kvzip scores context tokens by their largest attention while the context is repeated", "[policy]") {
  // Token 0 is the system prefix (the sink), 1-3 the context, 4 the question. Two repeat rows
  // (head_dim 2, keys and queries chosen so that the logits are 0 or +-ln 4):
  //   row 0 sees [sink, c1, c2, c3, r0] with weights [1, 4, 1, 1/4, 1] / 7.25,
  //   row 1 sees [sink, c1, c2, c3, r0, r1] with weights [1, 1, 4, 1, 1, 1] / 9.
  // Scores: c1 = 4/7.25, c2 = 4/9, c3 = 1/9; tokens 0 and 4 are kept whatever the budget.
  const float a = static_cast<float>(std::sqrt(std::log(4.0) * std::sqrt(2.0)));
  FakeSignals s(1, 1, 5);
  s.set_segments({0, 1, 1, 1, 2});
  s.keys_[0] = {{0, 0}, {a, 0}, {0, a}, {-a, 0}, {0, 0}};
  s.values_[0] = {{1, 0}, {1, 0}, {1, 0}, {1, 0}, {1, 0}};
  const std::vector<float> q = {a, 0, 0, a}, k = {0, 0, 0, 0};  // [rows, heads, d]
  const RepeatPassView rp = one_chunk(1, 4, 2, q, k);
  s.repeat_ = &rp;
  const auto policy = PolicyRegistry::instance().create("kvzip:level=head").policy;
  const auto scores = static_cast<const ScoringPolicy&>(*policy).score(s);
  REQUIRE(scores.size() == 1);
  CHECK(scores[0].score[1] == Approx(4 / 7.25));
  CHECK(scores[0].score[2] == Approx(4 / 9.0));
  CHECK(scores[0].score[3] == Approx(1 / 9.0));
  CHECK(scores[0].protect == std::vector<std::uint8_t>{1, 0, 0, 0, 1});
  CHECK(kept(policy->compress(s, Budget{3, 0.6}).heads[0]) == std::set<int>{0, 1, 4});
  CHECK(kept(policy->compress(s, Budget{4, 0.8}).heads[0]) == std::set<int>{0, 1, 2, 4});
  CHECK(kept(run("kvzip:level=layer", s, 4).heads[0]) == std::set<int>{0, 1, 2, 4});
  // Without the pass: an error that says how to get it, and the labelled proxy.
  s.repeat_ = nullptr;
  CHECK_THROWS_WITH(run("kvzip", s, 3), Catch::Contains("capture --repeat-pass"));
}

TEST_CASE("kvzip at model level (the original's) shares one threshold across layers", "[policy]") {
  // Two layers of one KV head: layer 0's repeat row is sharp (token 1 takes ~all the mass),
  // layer 1's flat (~1/5 on each context token).
  const float a = 2.0f;
  std::vector<FakeSignals> layers;
  layers.reserve(2);  // the signals stay where they are built
  std::vector<RepeatPassView> passes;
  const std::vector<float> k = {0, 0};
  const std::vector<std::vector<float>> q = {{3 * a, 0}, {0.1f, 0}};
  for (int l = 0; l < 2; ++l) passes.push_back(one_chunk(1, 4, 1, q[static_cast<std::size_t>(l)], k));
  for (int l = 0; l < 2; ++l) {
    FakeSignals& s = layers.emplace_back(1, 1, 4, l, 2);
    s.set_segments({0, 1, 1, 1});
    s.keys_[0] = {{0, 0}, {a, 0}, {0, a}, {-a, 0}};
    s.values_[0] = {{1, 0}, {1, 0}, {1, 0}, {1, 0}};
    s.repeat_ = &passes[static_cast<std::size_t>(l)];
  }
  const auto policy = PolicyRegistry::instance().create("kvzip").policy;
  REQUIRE(policy->selects_across_layers());
  std::vector<std::shared_ptr<const void>> summaries;
  for (const FakeSignals& s : layers) summaries.push_back(policy->layer_summary(s));
  // Budget 3 per head = 6 in the model: both sinks, then layer 0's token 1 and all three of
  // layer 1's context tokens (each above layer 0's ~2e-4); per layer, each would keep 3.
  const Budget budget{3, 0.75, policy->select_across_layers(summaries, Budget{3, 0.75})};
  CHECK(kept(policy->compress(layers[0], budget).heads[0]) == std::set<int>{0, 1});
  CHECK(kept(policy->compress(layers[1], budget).heads[0]) == std::set<int>{0, 1, 2, 3});
  const auto per_layer = PolicyRegistry::instance().create("kvzip:level=layer").policy;
  for (const FakeSignals& s : layers) CHECK(per_layer->compress(s, Budget{3, 0.75}).heads[0].kept() == 3);
}

TEST_CASE("kvzip at layer level shares one threshold across heads", "[policy]") {
  // Two KV heads, one query head each; head 0's context scores dominate head 1's.
  FakeSignals s(2, 2, 4);
  s.set_segments({0, 1, 1, 1});
  const float a = 2.0f;
  for (int h = 0; h < 2; ++h) {
    s.keys_[h] = {{0, 0}, {a, 0}, {0, a}, {-a, 0}};
    s.values_[h] = {{1, 0}, {1, 0}, {1, 0}, {1, 0}};
  }
  // One repeat row per chunk; head 0's query is sharp, head 1's flat.
  const std::vector<float> q = {3 * a, 0, 0.1f, 0}, k = {0, 0, 0, 0};  // [rows=1, heads=2, d=2]
  const RepeatPassView rp = one_chunk(1, 4, 1, q, k);
  s.repeat_ = &rp;
  // Head 0's row puts ~all its mass on token 1 (logit 8.5), head 1's spreads ~1/5 over each.
  // Budget 3 per head = 6 in the layer: the two sinks, then head 0's token 1 and all three of
  // head 1's context tokens (each above head 0's ~2e-4); per head, each would keep 3.
  const LayerPlan plan = run("kvzip:level=layer", s, 3);
  REQUIRE(plan.heads.size() == 2);
  CHECK(kept(plan.heads[0]) == std::set<int>{0, 1});
  CHECK(kept(plan.heads[1]) == std::set<int>{0, 1, 2, 3});
  const LayerPlan per_head = run("kvzip:level=head", s, 3);
  CHECK(per_head.heads[0].kept() == 3);
  CHECK(per_head.heads[1].kept() == 3);
}
