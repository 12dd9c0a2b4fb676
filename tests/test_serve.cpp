// The serving simulator's request traces, prefix cache and hit-rate replay (serve/): Mooncake
// JSONL read and refused by line and field; worked examples with known victims for every eviction
// policy; a prefix never evicted before its suffix; the hit-rate definition at the extremes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/rng.h"
#include "serve/chunk_workload.h"
#include "serve/hit_rate.h"
#include "serve/prefix_cache.h"
#include "serve/profile.h"
#include "serve/request_trace.h"
#include "trace_fixtures.h"

using namespace kvsim;
using namespace kvsim::serve;

namespace {

struct Req {
  double ts;
  std::int64_t input;
  std::vector<std::int64_t> ids;
};

std::string write_jsonl(const std::string& name, const std::vector<Req>& reqs) {
  const std::string path = test::scratch_file(name);
  std::ofstream f(path);
  for (const Req& r : reqs) {
    f << "{\"timestamp\": " << r.ts << ", \"input_length\": " << r.input << ", \"output_length\": 8, \"hash_ids\": [";
    for (std::size_t i = 0; i < r.ids.size(); ++i) f << (i ? ", " : "") << r.ids[i];
    f << "]}\n";
  }
  return path;
}

std::string write_lines(const std::string& name, const std::string& text) {
  const std::string path = test::scratch_file(name);
  std::ofstream(path) << text;
  return path;
}

// Requests of whole 512-token blocks (the last one `tail` tokens when given), one per time step.
std::vector<Req> requests(const std::vector<std::vector<std::int64_t>>& ids, std::int64_t tail = 512) {
  std::vector<Req> out;
  for (std::size_t i = 0; i < ids.size(); ++i)
    out.push_back({static_cast<double>(i), 512 * static_cast<std::int64_t>(ids[i].size() - 1) + tail, ids[i]});
  return out;
}

// Admits every request in order; returns the file ids of the evicted blocks, in order.
std::vector<std::int64_t> victims(const RequestTrace& t, std::int64_t capacity, EvictionOptions o) {
  const BlockTree tree(t);
  PrefixCache cache(tree, capacity, o);
  cache.record_evictions();
  for (std::size_t i = 0; i < t.requests.size(); ++i) cache.admit(t.requests[i], static_cast<std::int64_t>(i));
  std::vector<std::int64_t> out;
  for (std::int32_t b : cache.evicted()) out.push_back(t.hash[static_cast<std::size_t>(b)]);
  return out;
}

EvictionOptions policy(Eviction e) {
  EvictionOptions o;
  o.kind = e;
  return o;
}

}  // namespace

TEST_CASE("a Mooncake trace reads into requests over a tree of blocks", "[serve]") {
  const std::string path = write_jsonl("mooncake_ok.jsonl", {{0, 1100, {7, 8, 9}}, {5, 600, {7, 11}}, {5, 512, {7}}});
  const RequestTrace t = read_mooncake_trace(path);
  REQUIRE(t.requests.size() == 3);
  CHECK(t.blocks() == 4);
  CHECK(t.block_references() == 6);
  CHECK(t.hash == std::vector<std::int64_t>{7, 8, 9, 11});
  CHECK(t.parent == std::vector<std::int32_t>{-1, 0, 1, 0});
  CHECK(t.depth == std::vector<std::int32_t>{0, 1, 2, 1});
  CHECK(t.tokens == std::vector<std::int64_t>{512, 512, 76, 88});
  CHECK(t.requests[1].blocks == std::vector<std::int32_t>{0, 3});
  CHECK(t.start == std::vector<std::int64_t>{0, 512, 1024, 512});
  CHECK(t.chunk == std::vector<std::int32_t>{0, 1, 2, 3});  // every block a chunk of one state
  CHECK_FALSE(t.chunked());
  CHECK(t.requests[1].line == 2);
  const BlockTree tree(t);
  CHECK(tree.parent(3) == 0);
  CHECK(tree.parent(0) == -1);
  CHECK(tree.children(0) == 2);
}

TEST_CASE("bad request traces are refused by file, line and field", "[serve]") {
  const std::string ok = R"({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]})";
  auto refused = [&](const std::string& name, const std::string& second, const std::string& what) {
    INFO(second);
    CHECK_THROWS_WITH(read_mooncake_trace(write_lines(name, ok + "\n" + second + "\n")),
                      Catch::Contains(name + ":2") && Catch::Contains(what));
  };
  refused("bad_json.jsonl", "{\"timestamp\": 1,", "not valid JSON");
  // Found by fuzz_mooncake: a number out of double's range is not a syntax error but an
  // out_of_range exception, which escaped as "[json.exception.out_of_range.406]" with no file named.
  refused("huge_number.jsonl", R"({"timestamp": 21e+4111, "input_length": 10, "output_length": 1, "hash_ids": [1]})",
          "not valid JSON");
  refused("no_ts.jsonl", R"({"input_length": 10, "output_length": 1, "hash_ids": [2]})",
          "field 'timestamp' is missing");
  refused("neg_len.jsonl", R"({"timestamp": 1, "input_length": -4, "output_length": 1, "hash_ids": [2]})",
          "field 'input_length' is -4; expected an integer >= 0");
  refused("count.jsonl", R"({"timestamp": 1, "input_length": 600, "output_length": 1, "hash_ids": [2]})",
          "has 1 ids; expected 2");
  refused("neg_ts.jsonl", R"({"timestamp": -5, "input_length": 10, "output_length": 1, "hash_ids": [2]})",
          "field 'timestamp' is -5; expected milliseconds >= 0");
  refused("late.jsonl", R"({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": ["x"]})",
          "item 0 is \"x\"; expected an integer");
  refused("prefix.jsonl", R"({"timestamp": 0, "input_length": 1000, "output_length": 1, "hash_ids": [5, 1]})",
          "follows another block than on line 1; expected prefix hashes");
  refused("size.jsonl", R"({"timestamp": 0, "input_length": 20, "output_length": 1, "hash_ids": [1]})",
          "holds 20 tokens here and 10 on line 1");
  CHECK_THROWS_WITH(
      read_mooncake_trace(
          write_lines("backwards.jsonl", R"({"timestamp": 9, "input_length": 10, "output_length": 1, "hash_ids": [1]})"
                                         "\n" +
                                             ok + "\n")),
      Catch::Contains("backwards.jsonl:2: field 'timestamp' is 0, earlier than line 1's"));
  CHECK_THROWS_WITH(read_mooncake_trace(write_lines("empty.jsonl", "\n")), Catch::Contains("no requests"));
  CHECK_THROWS_WITH(read_mooncake_trace(test::scratch_file("absent.jsonl")), Catch::Contains("cannot open"));
  const RequestTrace t = read_mooncake_trace(write_lines("one.jsonl", ok + "\n"));
  const BlockTree tree(t);
  CHECK_THROWS_WITH(PrefixCache(tree, 0, {}), Catch::Contains("capacity 0 blocks; expected >= 1"));
  CHECK_THROWS_WITH(parse_eviction("fifo"), Catch::Contains("'fifo' is unknown; expected one of: lru, lfu, slru"));
}

TEST_CASE("worked examples: each eviction policy's victims", "[serve]") {
  SECTION("lru: the leaf used longest ago; a prefix only once its suffix is gone") {
    const RequestTrace t = read_mooncake_trace(write_jsonl("lru.jsonl", requests({{1, 2}, {3}, {4}, {1, 5}})));
    // {1,2,3} full: 4 evicts leaf 2 (time 0), which leaves 1 a leaf; 5 then evicts 3 (time 1), as
    // 1 was just touched by the request itself.
    CHECK(victims(t, 3, policy(Eviction::Lru)) == std::vector<std::int64_t>{2, 3});
  }
  SECTION("lfu: the leaf used least often") {
    const RequestTrace t = read_mooncake_trace(write_jsonl("lfu.jsonl", requests({{3}, {3}, {1, 2}, {4}})));
    CHECK(victims(t, 3, policy(Eviction::Lfu)) == std::vector<std::int64_t>{2});
    CHECK(victims(t, 3, policy(Eviction::Lru)) == std::vector<std::int64_t>{3});
  }
  SECTION("slru: probationary first; a full protected segment demotes its oldest") {
    const RequestTrace t =
        read_mooncake_trace(write_jsonl("slru.jsonl", requests({{3}, {3}, {1, 2}, {4}, {5}, {4}, {6}})));
    EvictionOptions o = policy(Eviction::Slru);
    o.slru_protected = 0.34;  // one protected block of three
    // 3 is protected by its hit: 4 evicts 2, 5 evicts 1; 4's hit protects it and demotes 3, which
    // 6 then evicts.
    CHECK(victims(t, 3, o) == std::vector<std::int64_t>{2, 1, 3});
  }
  SECTION("hits_per_token: a small tail block is worth more per token") {
    const RequestTrace t =
        read_mooncake_trace(write_jsonl("hpt.jsonl", {{0, 612, {1, 2}}, {1, 512, {3}}, {2, 512, {4}}}));
    CHECK(victims(t, 3, policy(Eviction::HitsPerToken)) == std::vector<std::int64_t>{3});
    CHECK(victims(t, 3, policy(Eviction::Lru)) == std::vector<std::int64_t>{2});
  }
  SECTION("rppc: a deep block saves more recomputation per byte than a shallow one") {
    const RequestTrace t = read_mooncake_trace(write_jsonl("rppc.jsonl", requests({{1, 2}, {3}, {4}})));
    CHECK(victims(t, 3, policy(Eviction::Rppc)) == std::vector<std::int64_t>{3});
    // Loading from a slow tier that costs more than recomputing: no benefit, so the tie falls to
    // recency and the LRU victim.
    EvictionOptions slow = policy(Eviction::Rppc);
    slow.load_ms_per_token = 1.0;
    CHECK(victims(t, 3, slow) == std::vector<std::int64_t>{2});
    // An HBM block whose eviction leaves a copy one tier down is worth its reload, not its
    // recompute: with a reload cheaper than either block's recompute, both are worth the same per
    // token, and recency decides.
    EvictionOptions demoted = policy(Eviction::Rppc);
    demoted.demoted_load_ms_per_token = 1e-6;
    CHECK(victims(t, 3, demoted) == std::vector<std::int64_t>{2});
    demoted.demoted_load_ms_per_token = 1e3;  // dearer than recompute: recompute is the miss
    CHECK(victims(t, 3, demoted) == std::vector<std::int64_t>{3});
  }
}

TEST_CASE("every eviction policy keeps prefixes: no cached block without its parent", "[serve]") {
  // A random trace of branching conversations: each request extends an earlier one or starts anew.
  Rng rng(11);
  std::vector<std::vector<std::int64_t>> ids;
  std::int64_t next = 0;
  for (int i = 0; i < 300; ++i) {
    std::vector<std::int64_t> r;
    if (!ids.empty() && rng.below(4) != 0) {
      const auto& base = ids[rng.below(ids.size())];
      r.assign(base.begin(), base.begin() + static_cast<std::ptrdiff_t>(1 + rng.below(base.size())));
    }
    for (std::uint64_t k = 0, n = 1 + rng.below(4); k < n; ++k) r.push_back(next++);
    ids.push_back(r);
  }
  const RequestTrace t = read_mooncake_trace(write_jsonl("branching.jsonl", requests(ids)));
  const BlockTree tree(t);
  const ReuseCeiling ceiling = reuse_ceiling(t);
  for (const std::string& name : eviction_names()) {
    for (const std::int64_t cap : {2, 7, 40, 150}) {
      INFO(name << " capacity " << cap);
      PrefixCache cache(tree, cap, policy(parse_eviction(name)));
      bool prefixes = true;
      for (std::size_t i = 0; i < t.requests.size(); ++i) {
        cache.admit(t.requests[i], static_cast<std::int64_t>(i));
        for (std::size_t b = 0; b < t.blocks(); ++b)
          if (cache.cached(static_cast<std::int32_t>(b)) && t.parent[b] >= 0 && !cache.cached(t.parent[b]))
            prefixes = false;
        REQUIRE(cache.size() <= cap);
      }
      CHECK(prefixes);
      CHECK(cache.evictions() > 0);
      const HitRateResult r = hit_rate(tree, cap, policy(parse_eviction(name)));
      CHECK(r.block_hit_rate() < ceiling.blocks);
    }
    // Unbounded capacity: every repeated block hits, the reuse ceiling exactly.
    const HitRateResult all = hit_rate(tree, static_cast<std::int64_t>(t.blocks()), policy(parse_eviction(name)));
    CHECK(all.evictions == 0);
    CHECK(all.block_hit_rate() == Approx(ceiling.blocks).epsilon(1e-12));
    CHECK(all.token_hit_rate() == Approx(ceiling.tokens).epsilon(1e-12));
  }
}

TEST_CASE("hit rate: the longest cached run from the first block, partial tail tokens counted", "[serve]") {
  // The second request repeats the first's two blocks (the tail of 100 tokens included) and adds
  // one; the third shares only the first block.
  const RequestTrace t = read_mooncake_trace(
      write_jsonl("hits.jsonl", {{0, 612, {1, 2}}, {1, 1124, {1, 3, 4}}, {2, 612, {1, 2}}, {3, 512, {9}}}));
  const BlockTree tree(t);
  const HitRateResult r = hit_rate(tree, 100, policy(Eviction::Lru));
  CHECK(r.block_refs == 8);
  CHECK(r.hit_blocks == 3);  // 1 in the second request, 1 and 2 in the third
  CHECK(r.tokens == 612 + 1124 + 612 + 512);
  CHECK(r.hit_tokens == 512 + 612);
  CHECK(r.block_hit_rate() == Approx(3.0 / 8));
}

TEST_CASE("cost profiles: non-negative fits, files, built-ins", "[serve]") {
  // Exact data from known coefficients come back exactly.
  std::vector<CostSample> pre;
  for (const double l : {64.0, 128.0, 512.0, 2048.0}) pre.push_back({l, l * l, 1, 3.0 + 0.5 * l + 1e-4 * l * l});
  const std::vector<double> w = fit_nonnegative(pre, false);
  CHECK(w[0] == Approx(3.0).epsilon(1e-9));
  CHECK(w[1] == Approx(0.5).epsilon(1e-9));
  CHECK(w[2] == Approx(1e-4).epsilon(1e-9));
  // Data whose unconstrained intercept is negative: held at 0, the rest refitted.
  std::vector<CostSample> steep;
  for (const double l : {100.0, 200.0, 300.0}) steep.push_back({l, l * l, 1, 2.0 * l - 50.0});
  const std::vector<double> s = fit_nonnegative(steep, false);
  CHECK(s[0] == 0.0);
  CHECK(s[1] > 0);
  // Decode with one sequence: the batch term cannot be told from the intercept and stays 0.
  std::vector<CostSample> dec;
  for (const double ctx : {128.0, 1024.0}) dec.push_back({ctx, 0, 1, 5.0 + 0.01 * ctx});
  const std::vector<double> d = fit_nonnegative(dec, true);
  CHECK(d[0] == Approx(5.0).epsilon(1e-9));
  CHECK(d[1] == Approx(0.01).epsilon(1e-9));
  CHECK(d[2] == 0.0);
  CHECK_THROWS_WITH(fit_nonnegative({}, false), Catch::Contains("admit no fit"));

  const ServeProfile h100 = load_profile("llama2-7b-h100"), h200 = load_profile("llama2-7b-h200");
  CHECK(h100.kv_bytes_per_token == 2.0 * 32 * 4096 * 2);
  CHECK(h200.decode.a_ms < h100.decode.a_ms);  // more HBM bandwidth, same weights
  CHECK(h100.prefill.recompute_ms(0, 512) == Approx(h100.prefill.prefill_ms(512)));
  // Causal prefill of l tokens: query i attends to i keys, l(l+1)/2 (query, key) pairs of
  // 4 x 32 layers x 4096 FLOP, at 40% of 989 TFLOP/s, beside the weights' 2 x 6.7e9 FLOP a token.
  const double l = 4096, flop_per_ms = 0.4 * 989e12 / 1e3;
  const double by_pairs = (2 * 6.7e9 * l + 4.0 * 32 * 4096 * l * (l + 1) / 2) / flop_per_ms;
  CHECK(h100.prefill.prefill_ms(4096) == Approx(by_pairs).epsilon(1e-3));
  CHECK(PrefillCost{}.prefill_ms(4096) == Approx(by_pairs).epsilon(1e-3));
  const std::string path = test::scratch_file("profile.json");
  write_profile(h200, path);
  const ServeProfile back = load_profile(path);
  CHECK(back.name == h200.name);
  CHECK(back.decode.b_ms_per_ctx_token == h200.decode.b_ms_per_ctx_token);
  CHECK(back.prefill.c_ms_per_token2 == h200.prefill.c_ms_per_token2);
  CHECK_THROWS_WITH(load_profile("h900"), Catch::Contains("not a built-in profile (llama2-7b-h100, llama2-7b-h200)"));
  CHECK_THROWS_WITH(load_profile(write_lines("noformat.json", "{}")), Catch::Contains("field 'format' is missing"));
  CHECK_THROWS_WITH(load_profile(write_lines("badname.json", R"({"format": "kvsim-serve-profile", "name": 7})")),
                    Catch::Contains("badname.json: field 'name' is 7; expected a string"));
  CHECK_THROWS_WITH(load_profile(write_lines("nodecode.json",
                                             R"({"format": "kvsim-serve-profile", "name": "x", "kv_bytes_per_token": 1,
                                                   "prefill": {"a_ms": 0, "b_ms_per_token": 1, "c_ms_per_token2": 0}})")),
                    Catch::Contains("field 'decode' is missing"));
  CHECK_THROWS_WITH(load_profile(write_lines("negative.json",
                                             R"({"format": "kvsim-serve-profile", "name": "x", "kv_bytes_per_token": 1,
                        "prefill": {"a_ms": 0, "b_ms_per_token": -1, "c_ms_per_token2": 0},
                        "decode": {"a_ms": 0, "b_ms_per_ctx_token": 1, "c_ms_per_seq": 0}})")),
                    Catch::Contains("prefill: field 'b_ms_per_token' is -1; expected a number >= 0"));
}

TEST_CASE("a chunked trace reads into chunk states: a chunk after another path is another block", "[serve]") {
  const std::string path = write_lines(
      "chunked_serve.jsonl",
      R"({"timestamp": 0, "chunks": [{"id": "sys", "tokens": 100}, {"id": "d1", "tokens": 300}, {"id": "d2", "tokens": 200}], "question_tokens": 20, "output_length": 4}
{"timestamp": 1, "chunks": [{"id": "sys", "tokens": 100}, {"id": "d2", "tokens": 200}], "question_tokens": 30, "output_length": 4}
{"timestamp": 2, "chunks": [{"id": "sys", "tokens": 100}, {"id": "d1", "tokens": 300}, {"id": "d2", "tokens": 200}], "question_tokens": 10, "output_length": 4}
)");
  const RequestTrace t = read_serve_trace(path);
  REQUIRE(t.chunked());
  CHECK(t.chunk_ids == std::vector<std::string>{"sys", "d1", "d2"});
  CHECK(t.blocks() == 4);  // sys, d1 after sys, d2 after (sys, d1), d2 after sys
  CHECK(t.parent == std::vector<std::int32_t>{-1, 0, 1, 0});
  CHECK(t.chunk == std::vector<std::int32_t>{0, 1, 2, 2});
  CHECK(t.start == std::vector<std::int64_t>{0, 100, 400, 100});
  CHECK(t.tokens == std::vector<std::int64_t>{100, 300, 200, 200});
  CHECK(t.requests[1].blocks == std::vector<std::int32_t>{0, 3});
  CHECK(t.requests[0].input_tokens == 620);
  CHECK(t.requests[1].question_tokens == 30);
  CHECK(t.requests[2].blocks == t.requests[0].blocks);
  // Stateful prefix caching: d2 after another path is a miss; the same path again hits in full.
  const BlockTree tree(t);
  const HitRateResult r = hit_rate(tree, 100, policy(Eviction::Lru));
  CHECK(r.block_refs == 8);
  CHECK(r.hit_blocks == 1 + 3);  // request 2's sys; request 3's three
  CHECK(r.tokens == 620 + 330 + 610);
  CHECK(r.hit_tokens == 100 + 600);
  CHECK(read_serve_trace(write_jsonl("mooncake_auto.jsonl", {{0, 600, {7, 8}}})).blocks() == 2);

  auto refused = [](const std::string& name, const std::string& line, const std::string& message) {
    CHECK_THROWS_WITH(read_chunked_trace(write_lines(name, line + "\n")), Catch::Contains(message));
  };
  refused("ch1.jsonl", R"({"timestamp": 0, "chunks": [], "question_tokens": 1, "output_length": 1})",
          "field 'chunks' is missing or not a non-empty list");
  refused("ch2.jsonl",
          R"({"timestamp": 0, "chunks": [{"id": "a", "tokens": 0}], "question_tokens": 1, "output_length": 1})",
          "chunks[0]: field 'tokens' is 0; expected an integer > 0");
  refused(
      "ch3.jsonl",
      R"({"timestamp": 0, "chunks": [{"id": "a", "tokens": 5}, {"id": "a", "tokens": 5}], "question_tokens": 1, "output_length": 1})",
      "chunks[1]: chunk 'a' appears twice in the request");
  refused("ch4.jsonl", R"({"timestamp": 0, "chunks": [{"id": "a", "tokens": 5}], "output_length": 1})",
          "field 'question_tokens' is missing");
  CHECK_THROWS_WITH(
      read_chunked_trace(write_lines(
          "ch5.jsonl",
          R"({"timestamp": 0, "chunks": [{"id": "a", "tokens": 5}], "question_tokens": 1, "output_length": 1}
{"timestamp": 1, "chunks": [{"id": "b", "tokens": 3}, {"id": "a", "tokens": 6}], "question_tokens": 1, "output_length": 1}
)")),
      Catch::Contains("ch5.jsonl:2: chunks[1]: chunk 'a' holds 6 tokens here and 5 on line 1"));
}

TEST_CASE("chunked serving workloads: popular chunks in many states (rag), whole paths reused (agent)", "[serve]") {
  ChunkWorkloadSpec s;
  s.requests = 400;
  s.pool = 40;
  s.per_request = 3;
  s.rate = 10;
  s.seed = 9;
  CHECK(chunk_workload_jsonl(s) == chunk_workload_jsonl(s));  // reproducible
  const RequestTrace rag = read_chunked_trace(write_lines("rag_serve.jsonl", chunk_workload_jsonl(s)));
  REQUIRE(rag.requests.size() == 400);
  CHECK(rag.chunk_ids.front() == "system");
  std::vector<int> states(rag.chunk_ids.size(), 0);
  for (const std::int32_t c : rag.chunk) ++states[static_cast<std::size_t>(c)];
  CHECK(*std::max_element(states.begin(), states.end()) >= 10);            // a popular document after many paths
  CHECK(rag.requests.back().arrival_ms / 1e3 == Approx(40).epsilon(0.2));  // 400 arrivals at 10 per second
  for (const ServeRequest& r : rag.requests) CHECK(r.blocks.size() == 4);  // the system chunk, 3 documents

  s.kind = ChunkWorkloadKind::Agent;
  const RequestTrace agent = read_chunked_trace(write_lines("agent_serve.jsonl", chunk_workload_jsonl(s)));
  for (std::size_t i = 0; i < agent.requests.size(); ++i) {
    const auto& blocks = agent.requests[i].blocks;
    CHECK(blocks.size() == 2 + i % 3);  // the system chunk and one more tool output a turn
    if (i % 3 != 0) {                   // a later turn: the previous turn's states, then one more
      const auto& before = agent.requests[i - 1].blocks;
      CHECK(std::equal(before.begin(), before.end(), blocks.begin()));
    }
  }
  s.per_request = 41;
  CHECK_THROWS_WITH(chunk_workload_jsonl(s), Catch::Contains("--per-request 41 exceeds --pool 40"));
  CHECK_THROWS_WITH(parse_chunk_workload("chat"), Catch::Contains("expected rag | agent"));
}
