// learned/ policies: the rlkv head allocation's worked example, and the policies' plans.
#include <catch2/catch.hpp>

#include "fake_signals.h"
#include "learned/head_allocation.h"
#include "learned/model_file.h"
#include "learned_fixtures.h"
#include "policies/registry.h"

using namespace kvsim;
using kvsim::learned::allocate_heads;

TEST_CASE("rlkv: the highest gates keep everything, the rest share what is left", "[learned]") {
  // Four heads of 100 tokens, streaming window 4 + 16 = 20.
  const std::vector<double> gates = {0.2, 0.9, 0.5, 0.7};
  const std::vector<std::int64_t> n(4, 100);
  // 160 tokens: one head whole (100) + three streaming windows (60): head 1, the highest gate.
  auto a = allocate_heads(gates, n, 160, 4, 16);
  CHECK(a.full == std::vector<std::uint8_t>{0, 1, 0, 0});
  CHECK(a.keep == std::vector<std::int64_t>{20, 100, 20, 20});
  // 190: still one head whole; the 30 left widen the streaming windows by 10 each.
  a = allocate_heads(gates, n, 190, 4, 16);
  CHECK(a.keep == std::vector<std::int64_t>{30, 100, 30, 30});
  // 250: heads 1 and 3 whole (200), 50 left over two streaming heads.
  a = allocate_heads(gates, n, 250, 4, 16);
  CHECK(a.full == std::vector<std::uint8_t>{0, 1, 0, 1});
  CHECK(a.keep == std::vector<std::int64_t>{25, 100, 25, 100});
  // 60: not even four streaming windows fit: 15 each.
  a = allocate_heads(gates, n, 60, 4, 16);
  CHECK(a.full == std::vector<std::uint8_t>{0, 0, 0, 0});
  CHECK(a.keep == std::vector<std::int64_t>{15, 15, 15, 15});
  // 62: 15 each, and the 2 left go to the highest gates.
  a = allocate_heads(gates, n, 62, 4, 16);
  CHECK(a.keep == std::vector<std::int64_t>{15, 16, 15, 16});
  // Everything fits.
  a = allocate_heads(gates, n, 400, 4, 16);
  CHECK(a.keep == std::vector<std::int64_t>(4, 100));
}

TEST_CASE("rlkv plans keep the sinks and the newest tokens of streaming heads", "[learned]") {
  test::FakeSignals s(2, 2, 10, /*layer=*/1, /*n_layers=*/2);
  ModelGeometry g = s.geometry();
  learned::LearnedModel m;
  m.method = "rlkv";
  m.geometry = g;
  m.head_gates = {0.0, 0.0, 0.1, 0.8};  // layer 1: head 1 is the retrieval head
  m.curve.metric = "none";
  const std::string path = test::scratch_file("rlkv_plan.h5");
  learned::write_learned_model(m, path);
  const PolicyInstance p = PolicyRegistry::instance().create("rlkv:model=" + path + ",sinks=2,recent=2");
  // 7 tokens per head, 14 for the layer: head 1 keeps all 10, head 0 its 4-token window.
  const LayerPlan plan = p.policy->compress(s, Budget(7, 0.7));
  REQUIRE(plan.heads.size() == 2);
  CHECK(plan.heads[1].kept() == 10);
  const auto& c = plan.heads[0].codec;
  std::vector<int> kept;
  for (std::size_t j = 0; j < c.size(); ++j)
    if (c[j] != TokenCodec::Drop) kept.push_back(static_cast<int>(j));
  CHECK(kept == std::vector<int>{0, 1, 8, 9});
  // A model for other geometry, or of another method, is refused naming the file.
  test::FakeSignals wide(4, 4, 10, 0, 2);
  CHECK_THROWS_WITH(p.policy->compress(wide, Budget(7, 0.7)), Catch::Contains(path) && Catch::Contains("/geometry"));
  const std::string foresight = test::seeded_model_file("foresight", g);
  CHECK_THROWS_WITH(PolicyRegistry::instance().create("rlkv:model=" + foresight), Catch::Contains("expected 'rlkv'"));
  CHECK_THROWS_WITH(PolicyRegistry::instance().create("foresight:model=" + path),
                    Catch::Contains("expected 'foresight'"));
}
