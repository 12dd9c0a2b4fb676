// The timed serving simulation (serve/simulator.h) and its materialisation planner
// (serve/materialize.h): worked examples whose times follow by hand from a simple cost profile,
// the tiers' demotion and loads, transitions, chunked prefill and batching, pins in the prefix
// cache, determinism and bad options.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>

#include "core/error.h"
#include "core/rng.h"
#include "serve/materialize.h"
#include "serve/simulator.h"
#include "trace_fixtures.h"

using namespace kvsim;
using namespace kvsim::serve;

namespace {

struct Req {
  double ts;
  std::int64_t input, output;
  std::vector<std::int64_t> ids;
};

RequestTrace trace_of(const std::string& name, const std::vector<Req>& reqs) {
  const std::string path = test::scratch_file(name);
  std::ofstream f(path);
  for (const Req& r : reqs) {
    f << "{\"timestamp\": " << r.ts << ", \"input_length\": " << r.input << ", \"output_length\": " << r.output
      << ", \"hash_ids\": [";
    for (std::size_t i = 0; i < r.ids.size(); ++i) f << (i ? ", " : "") << r.ids[i];
    f << "]}\n";
  }
  f.close();
  return read_mooncake_trace(path);
}

// Prefill a + b*l (no attention term), decode steps of 2 ms, 1000 KV bytes per token: every time
// below follows by hand.
SimOptions simple() {
  SimOptions o;
  o.profile.name = "simple";
  o.profile.prefill = {"simple", 1.0, 0.01, 0.0};
  o.profile.decode = {2.0, 0.0, 0.0};
  o.profile.kv_bytes_per_token = 1000;
  o.hbm_gb = 1;
  o.max_batch_tokens = 4096;
  return o;
}

BlockState block(std::int64_t i, bool hbm, bool dram, bool ssd, int sibling = -1) {
  BlockState b;
  b.start = 512 * i;
  b.tokens = 512;
  b.bytes = 512000;
  b.sibling_bytes = 512000;
  b.in = {hbm, dram, ssd};
  b.sibling_tier = sibling;
  return b;
}

}  // namespace

TEST_CASE("materialisation: the cheapest way per block, runs loaded as one transfer", "[serve]") {
  MaterializeCosts c;
  c.prefill = {"p", 0.0, 0.01, 1e-6};  // recompute of block i: 5.12 + 1e-6*((512(i+1))^2 - (512i)^2) ms
  c.links[1] = {1.0, 0.5};             // DRAM: 0.512 ms per block + 0.5 ms per transfer
  c.links[2] = {0.05, 0.1};            // SSD: 10.24 ms per block + 0.1 ms
  auto recompute = [&](std::int64_t i) { return c.prefill.recompute_ms(512 * i, 512); };
  // HBM, DRAM, DRAM, nothing, SSD (shallow: recompute wins), ..., SSD deep enough to win.
  std::vector<BlockState> blocks = {block(0, true, false, false), block(1, false, true, false),
                                    block(2, false, true, false), block(3, false, false, false),
                                    block(4, false, false, true)};
  for (int i = 5; i < 12; ++i) blocks.push_back(block(i, false, false, false));
  blocks.push_back(block(12, false, false, true));
  const MaterializePlan p = plan_materialization(blocks, c);
  REQUIRE(p.way.size() == 13);
  CHECK(p.way[0] == Way::Hbm);
  CHECK(p.way[1] == Way::LoadDram);
  CHECK(p.way[2] == Way::LoadDram);
  CHECK(p.way[3] == Way::Recompute);
  CHECK(recompute(4) < c.links[2].ms(512000));  // 5.12 + 2.36 < 10.34
  CHECK(p.way[4] == Way::Recompute);
  CHECK(recompute(12) > c.links[2].ms(512000));  // 5.12 + 6.55 > 10.34
  CHECK(p.way[12] == Way::LoadSsd);
  double expected = 0.5 + 1.024;  // the DRAM run, one transfer
  for (int i = 3; i < 12; ++i) expected += recompute(i);
  expected += c.links[2].ms(512000);
  CHECK(p.ms == Approx(expected).epsilon(1e-12));
  double all = 0;
  for (int i = 1; i < 13; ++i) all += recompute(i);
  CHECK(p.recompute_only_ms == Approx(all).epsilon(1e-12));
  // Load-only loads block 4 from SSD although recomputing it is cheaper.
  CHECK(p.load_only_ms == Approx(expected - recompute(4) + c.links[2].ms(512000)).epsilon(1e-12));

  SECTION("a shorter run lets a faster tier take over") {
    // SSD holds blocks 0..5, DRAM 3..5: SSD for 0..2 in one transfer, then DRAM.
    c.prefill = {"p", 0.0, 0.1, 0.0};  // recompute dearer than any load here
    std::vector<BlockState> mixed;
    for (int i = 0; i < 6; ++i) mixed.push_back(block(i, false, i >= 3, true));
    const MaterializePlan m = plan_materialization(mixed, c);
    for (int i = 0; i < 6; ++i) CHECK(m.way[static_cast<std::size_t>(i)] == (i < 3 ? Way::LoadSsd : Way::LoadDram));
    CHECK(m.ms == Approx(c.links[2].ms(3 * 512000) + c.links[1].ms(3 * 512000)).epsilon(1e-12));
  }
  SECTION("a transition from a cached sibling recomputes only the differing share") {
    c.transitions = true;
    c.transition_diff = 0.25;  // 128 of 512 tokens
    std::vector<BlockState> two = {block(0, true, false, false), block(1, false, false, false, 0)};
    const MaterializePlan t = plan_materialization(two, c);
    CHECK(t.way[1] == Way::Transition);
    CHECK(t.ms == Approx(c.prefill.recompute_ms(1024 - 128, 128)).epsilon(1e-12));
    CHECK(t.recompute_only_ms == Approx(recompute(1)).epsilon(1e-12));
    two[1].sibling_tier = 2;  // a sibling on SSD costs its load too: recompute wins
    CHECK(plan_materialization(two, c).way[1] == Way::Recompute);
    c.transitions = false;
    two[1].sibling_tier = 0;
    CHECK(plan_materialization(two, c).way[1] == Way::Recompute);
  }
}

TEST_CASE("pins keep a block in the prefix cache until released", "[serve]") {
  const RequestTrace t = trace_of("pins.jsonl", {{0, 1024, 1, {1, 2}}, {1, 512, 1, {3}}});
  const BlockTree tree(t);
  PrefixCache c(tree, 100, EvictionOptions{});
  std::int64_t now = 0;
  for (const std::int32_t b : {0, 1, 2}) c.insert(b, ++now);
  CHECK(c.pin(1));
  CHECK_FALSE(c.pin(1));       // counted
  CHECK(c.evict(++now) == 2);  // block 0 has a cached child, block 1 is pinned
  CHECK(c.evict(++now) == -1);
  CHECK_FALSE(c.unpin(1));
  CHECK(c.unpin(1));
  CHECK(c.evict(++now) == 1);
  CHECK(c.evict(++now) == 0);
  CHECK(c.size() == 0);
  CHECK_THROWS_AS(c.unpin(1), Error);
  CHECK_THROWS_AS(c.touch(1, ++now), Error);
}

TEST_CASE("timed simulation: one request's TTFT, decode steps and throughput by hand", "[serve]") {
  const RequestTrace t = trace_of("one.jsonl", {{0, 1024, 3, {1, 2}}});
  const BlockTree tree(t);
  const SimResult r = simulate(tree, simple());
  CHECK(r.completed == 1);
  CHECK(r.ttft_ms.p50 == Approx(1 + 10.24));  // prefill intercept + 1024 tokens
  CHECK(r.tbt_ms.p50 == Approx(2.0));
  CHECK(r.output_tokens == 3);
  CHECK(r.makespan_s == Approx((11.24 + 2 + 2) / 1e3));
  CHECK(r.throughput_tokens_s == Approx(3 / 0.01524));
  CHECK(r.prefill_tokens == 1024);
  CHECK(r.steps == 3);
  CHECK(r.load.busy_ms == Approx(11.24 + 2 + 2));
  CHECK_FALSE(r.load.overloaded);  // one arrival: no rate to hold

  SECTION("chunked prefill: 256 tokens a step") {
    SimOptions o = simple();
    o.max_batch_tokens = 256;
    CHECK(simulate(tree, o).ttft_ms.p50 == Approx(4 * (1 + 2.56)));
  }
}

TEST_CASE("timed simulation: overload is reported with the instances that would hold it", "[serve]") {
  // 64 distinct 2,048-token prompts (prefill 1 + 20.48 ms each), 4 output tokens, arriving every
  // `gap` ms: at 5 ms one instance gets ~4.5 ms of work per ms and the queue grows with every
  // arrival; at 100 ms it idles most of the time.
  auto arrivals = [](const std::string& name, double gap) {
    std::vector<Req> reqs;
    for (std::int64_t i = 0; i < 64; ++i)
      reqs.push_back({gap * static_cast<double>(i), 2048, 4, {4 * i, 4 * i + 1, 4 * i + 2, 4 * i + 3}});
    return trace_of(name, reqs);
  };
  SimOptions o = simple();
  o.route = Route::LeastLoaded;
  const RequestTrace heavy = arrivals("heavy.jsonl", 5);
  const BlockTree heavy_tree(heavy);
  const SimResult r = simulate(heavy_tree, o);
  CHECK(r.load.arrival_span_ms == Approx(5 * 63));
  CHECK(r.load.offered_load == Approx(r.load.busy_ms / (5 * 63)));
  CHECK(r.load.offered_load > 4);
  CHECK(r.load.ttft_last_ms > 4 * r.load.ttft_first_ms);
  CHECK(r.load.overloaded);
  CHECK(r.load.suggested_instances >= 5);
  // The suggested count holds the load.
  o.instances = r.load.suggested_instances;
  const SimResult held = simulate(heavy_tree, o);
  CHECK_FALSE(held.load.overloaded);
  CHECK(held.load.offered_load < 1);
  CHECK(held.load.suggested_instances == o.instances);

  o.instances = 1;
  const SimResult light = simulate(BlockTree(arrivals("light.jsonl", 100)), o);
  CHECK(light.load.offered_load < 0.5);
  CHECK_FALSE(light.load.overloaded);
  CHECK(light.load.suggested_instances == 1);
}

TEST_CASE("timed simulation: prefix hits, batching and transitions", "[serve]") {
  SECTION("a later request reuses the cached first block") {
    const RequestTrace t = trace_of("reuse.jsonl", {{0, 1024, 3, {1, 2}}, {100, 1024, 3, {1, 3}}});
    const BlockTree tree(t);
    const SimResult r = simulate(tree, simple());
    CHECK(r.ttft_ms.p50 == Approx(1 + 5.12));  // the lower of the two: the second request's
    CHECK(r.ttft_ms.p99 == Approx(1 + 10.24));
    CHECK(r.block_refs == 4);
    CHECK(r.hit_rate() == Approx(0.25));
    CHECK(r.prefill_tokens == 1024 + 512);
  }
  SECTION("two requests at once share one step") {
    const RequestTrace t = trace_of("batch.jsonl", {{0, 512, 1, {1}}, {0, 512, 1, {2}}});
    const SimResult r = simulate(BlockTree(t), simple());
    CHECK(r.ttft_ms.p50 == Approx(1 + 5.12 + 5.12));
    CHECK(r.ttft_ms.p99 == Approx(1 + 5.12 + 5.12));
    CHECK(r.steps == 1);
  }
  SECTION("a transition from the sibling left in HBM") {
    const RequestTrace t = trace_of("transition.jsonl", {{0, 1024, 3, {1, 2}}, {100, 1024, 3, {1, 3}}});
    const BlockTree tree(t);
    SimOptions o = simple();
    o.transitions = true;
    const SimResult r = simulate(tree, o);
    CHECK(r.ttft_ms.p50 == Approx(1 + 1.28));  // 128 of block 3's 512 tokens recomputed
    CHECK(r.share(Way::Transition) == Approx(0.25));
    CHECK(r.recompute_only_ms == Approx(10.24 + 5.12));
    CHECK(r.planned_ms == Approx(10.24 + 1.28));
  }
}

TEST_CASE("timed simulation: HBM victims go down to DRAM and are loaded back", "[serve]") {
  // HBM holds 1.2 MB: one request's two 512 kB blocks and its output. B evicts A's blocks to
  // DRAM; C, A's prompt again, loads them back in one transfer.
  const RequestTrace t =
      trace_of("tiers.jsonl", {{0, 1024, 3, {1, 2}}, {100, 1024, 3, {3, 4}}, {200, 1024, 3, {1, 2}}});
  const BlockTree tree(t);
  SimOptions o = simple();
  o.hbm_gb = 0.0012;
  o.dram = {1.0, 1.0, 0.01};  // 1 GB at 1 GB/s: 0.512 ms per block, 0.01 ms per transfer
  const SimResult r = simulate(tree, o);
  CHECK(r.completed == 3);
  CHECK(r.share(Way::LoadDram) == Approx(2.0 / 6));
  CHECK(r.loaded_gb[1] == Approx(1.024e-3));
  CHECK(r.written_gb[1] == Approx(4 * 0.512e-3));
  // C: the transfer (0.01 + 1.024 ms), then the last token for its logits (1 + 0.01 ms).
  CHECK(r.ttft_ms.mean == Approx((11.24 + 11.24 + 1.034 + 1.01) / 3));
  CHECK(r.evictions == 4);

  SECTION("without a DRAM tier the blocks are recomputed") {
    SimOptions h = simple();
    h.hbm_gb = 0.0012;
    const SimResult n = simulate(tree, h);
    CHECK(n.hit_rate() == 0);
    CHECK(n.ttft_ms.p50 == Approx(11.24));
  }
  SECTION("a request larger than HBM is rejected, the rest run") {
    const RequestTrace more =
        trace_of("rejected.jsonl", {{0, 1024, 3, {1, 2}}, {100, 512, 3, {3}}, {200, 1024, 3, {4, 5}}});
    SimOptions h = o;
    h.hbm_gb = 0.0009;  // one block and its output fit, two do not
    const SimResult n = simulate(BlockTree(more), h);
    CHECK(n.rejected == 2);
    CHECK(n.completed == 1);
    CHECK(n.ttft_ms.count == 1);
    CHECK(n.ttft_ms.p50 == Approx(1 + 5.12));
  }
  SECTION("without DRAM, HBM's victims go to SSD and come back from there") {
    SimOptions s = simple();
    s.hbm_gb = 0.0012;
    s.ssd = {1.0, 1.0, 0.01};
    const SimResult n = simulate(tree, s);
    CHECK(n.share(Way::LoadSsd) == Approx(2.0 / 6));
    CHECK(n.share(Way::LoadDram) == 0);
    CHECK(n.written_gb[2] == Approx(4 * 0.512e-3));
    CHECK(n.loaded_gb[2] == Approx(1.024e-3));
    CHECK(n.ttft_ms.mean == Approx((11.24 + 11.24 + 1.034 + 1.01) / 3));
  }
  SECTION("a transition from a sibling in DRAM loads the sibling, then fixes its tail") {
    // C = block 1 (in DRAM, loaded) + block 5, new, whose sibling 2 sits in DRAM.
    const RequestTrace sib =
        trace_of("sibling.jsonl", {{0, 1024, 3, {1, 2}}, {100, 1024, 3, {3, 4}}, {200, 1024, 3, {1, 5}}});
    SimOptions s = o;
    s.transitions = true;
    const SimResult n = simulate(BlockTree(sib), s);
    CHECK(n.share(Way::LoadDram) == Approx(1.0 / 6));
    CHECK(n.share(Way::Transition) == Approx(1.0 / 6));
    CHECK(n.loaded_gb[1] == Approx(1.024e-3));  // block 1 and the sibling, one transfer each
    // Both transfers queue on the DRAM link (2 x 0.522 ms), then 128 tokens (1 + 1.28 ms).
    CHECK(n.ttft_ms.mean == Approx((11.24 + 11.24 + 1.044 + 2.28) / 3));
  }
}

TEST_CASE("timed simulation: routing by cached prefix", "[serve]") {
  // The second request repeats the first: prefix routing sends it where the blocks are.
  const RequestTrace t = trace_of("route.jsonl", {{0, 1024, 3, {1, 2}}, {100, 1024, 3, {1, 2}}});
  const BlockTree tree(t);
  SimOptions o = simple();
  o.instances = 2;
  o.route = Route::Prefix;
  CHECK(simulate(tree, o).hit_rate() == Approx(0.5));
  o.route = Route::RoundRobin;
  CHECK(simulate(tree, o).hit_rate() == 0);
  o.route = Route::LeastLoaded;  // both idle: the first instance
  CHECK(simulate(tree, o).hit_rate() == Approx(0.5));
}

TEST_CASE("timed simulation: deterministic, compression fits more, bad options refused", "[serve]") {
  Rng rng(5);
  std::vector<Req> reqs;
  std::vector<std::vector<std::int64_t>> prompts;
  std::int64_t next = 0;
  for (int i = 0; i < 200; ++i) {
    std::vector<std::int64_t> ids;
    if (!prompts.empty() && rng.below(3) != 0) {
      const auto& base = prompts[rng.below(prompts.size())];
      ids.assign(base.begin(), base.begin() + static_cast<std::ptrdiff_t>(1 + rng.below(base.size())));
    }
    for (std::uint64_t k = 0, n = 1 + rng.below(6); k < n; ++k) ids.push_back(next++);
    prompts.push_back(ids);
    reqs.push_back(
        {20.0 * i, 512 * static_cast<std::int64_t>(ids.size()), 1 + static_cast<std::int64_t>(rng.below(40)), ids});
  }
  const RequestTrace t = trace_of("random.jsonl", reqs);
  const BlockTree tree(t);
  SimOptions o = simple();
  o.hbm_gb = 0.05;  // ~97 blocks
  o.dram = {0.05, 10, 0.01};
  o.instances = 2;
  for (const Eviction e : {Eviction::Lru, Eviction::Lfu, Eviction::Slru, Eviction::HitsPerToken, Eviction::Rppc}) {
    INFO(eviction_name(e));
    o.eviction = e;
    const SimResult a = simulate(tree, o), b = simulate(tree, o);
    CHECK(a.completed + a.rejected == 200);
    CHECK(a.completed > 190);
    CHECK(a.ttft_ms.p99 == b.ttft_ms.p99);
    CHECK(a.blocks_by_way == b.blocks_by_way);
    CHECK(a.makespan_s == b.makespan_s);
    CHECK(a.hit_rate() > 0);
  }
  o.eviction = Eviction::Lru;
  const SimResult full = simulate(tree, o);
  o.kv_ratio = 0.5;
  const SimResult half = simulate(tree, o);
  CHECK(half.hbm_blocks == Approx(2 * full.hbm_blocks));
  CHECK(half.share(Way::Hbm) > full.share(Way::Hbm));

  SimOptions bad = simple();
  bad.hbm_gb = 0;
  CHECK_THROWS_WITH(simulate(tree, bad), Catch::Contains("HBM capacity"));
  bad = simple();
  bad.dram = {10, 0, 0};
  CHECK_THROWS_WITH(simulate(tree, bad), Catch::Contains("DRAM bandwidth"));
  bad = simple();
  bad.instances = 0;
  CHECK_THROWS_WITH(simulate(tree, bad), Catch::Contains("instances"));
  CHECK_THROWS_WITH(parse_route("random"), Catch::Contains("prefix, round-robin, least-loaded"));
}

TEST_CASE("timed simulation of a chunked trace: states hit, the question always computed", "[serve]") {
  const std::string path = test::scratch_file("chunked_sim.jsonl");
  std::ofstream(path)
      << R"({"timestamp": 0, "chunks": [{"id": "sys", "tokens": 100}, {"id": "doc", "tokens": 400}], "question_tokens": 20, "output_length": 2}
{"timestamp": 1000, "chunks": [{"id": "sys", "tokens": 100}, {"id": "doc", "tokens": 400}], "question_tokens": 30, "output_length": 2}
{"timestamp": 2000, "chunks": [{"id": "sys", "tokens": 100}, {"id": "x", "tokens": 50}, {"id": "doc", "tokens": 400}], "question_tokens": 10, "output_length": 2}
)";
  const RequestTrace t = read_serve_trace(path);
  const SimResult r = simulate(BlockTree(t), simple());
  CHECK(r.completed == 3);
  // First: everything; second: its question; third: x, doc in its new state, and its question.
  CHECK(r.prefill_tokens == 520 + 30 + 460);
  CHECK(r.share(Way::Hbm) == Approx(3.0 / 7));                    // sys twice, (sys, doc) once, of 7 block references
  CHECK(t.nominal_block_tokens() == (100 + 400 + 50 + 400) / 4);  // a capacity in blocks counts these
  CHECK(std::isfinite(r.hbm_blocks));
  // Alone on the instance, each waits for its own prefill only: a + b * its computed tokens.
  CHECK(r.ttft_ms.mean == Approx((1 + 5.2 + 1 + 0.3 + 1 + 4.6) / 3));
}
