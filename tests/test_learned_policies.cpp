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
  // 6 tokens per head, 24 for the model (2 layers x 2 heads). Ranked over the model, layer 1's
  // head 1 (gate 0.8) keeps all 10 and the others their 4-token windows (22); the 2 tokens left
  // widen the next streaming heads in gate order: layer 1's head 0, then layer 0's head 0.
  const auto kept_tokens = [](const HeadPlan& h) {
    std::vector<int> kept;
    for (std::size_t j = 0; j < h.codec.size(); ++j)
      if (h.codec[j] != TokenCodec::Drop) kept.push_back(static_cast<int>(j));
    return kept;
  };
  const LayerPlan plan = p.policy->compress(s, Budget(6, 0.6));
  REQUIRE(plan.heads.size() == 2);
  CHECK(plan.heads[1].kept() == 10);
  CHECK(kept_tokens(plan.heads[0]) == std::vector<int>{0, 1, 7, 8, 9});
  test::FakeSignals first(2, 2, 10, /*layer=*/0, /*n_layers=*/2);
  const LayerPlan plan0 = p.policy->compress(first, Budget(6, 0.6));
  CHECK(kept_tokens(plan0.heads[0]) == std::vector<int>{0, 1, 7, 8, 9});
  CHECK(kept_tokens(plan0.heads[1]) == std::vector<int>{0, 1, 8, 9});
  // 7 per head (28): the two highest gates, both of layer 1, keep everything; layer 0 streams.
  CHECK(p.policy->compress(s, Budget(7, 0.7)).heads[0].kept() == 10);
  CHECK(p.policy->compress(first, Budget(7, 0.7)).heads[0].kept() == 4);
  // A model for other geometry, or of another method, is refused naming the file.
  test::FakeSignals wide(4, 4, 10, 0, 2);
  CHECK_THROWS_WITH(p.policy->compress(wide, Budget(7, 0.7)), Catch::Contains(path) && Catch::Contains("/geometry"));
  const std::string foresight = test::seeded_model_file("foresight", g);
  CHECK_THROWS_WITH(PolicyRegistry::instance().create("rlkv:model=" + foresight), Catch::Contains("expected 'rlkv'"));
  CHECK_THROWS_WITH(PolicyRegistry::instance().create("foresight:model=" + path),
                    Catch::Contains("expected 'foresight'"));
}

TEST_CASE("rlkv on SmolLM2's geometry at budget 0.25: ranked over the model, some heads keep everything", "[learned]") {
  // 30 layers x 3 KV heads, 600 cached tokens. Ranked per layer, a whole head (600) and two
  // streaming windows (2 x 80) would need 760 of a layer's 450 tokens: every head would stream,
  // StreamingLLM under another name. Ranked over the model, the budget's 13,500 tokens hold some.
  const int L = 30, H = 3;
  const std::int64_t n = 600;
  test::FakeSignals probe(9, H, n, 0, L);
  const ModelGeometry g = probe.geometry();
  const std::string path = test::seeded_model_file("rlkv", g);
  const PolicyInstance p = PolicyRegistry::instance().create("rlkv:model=" + path);
  const learned::LearnedModel m = learned::read_learned_model(path);
  int whole = 0;
  std::int64_t kept = 0;
  double lowest_whole = 1e9, highest_streaming = -1e9;
  for (int l = 0; l < L; ++l) {
    test::FakeSignals s(9, H, n, l, L);
    const LayerPlan plan = p.policy->compress(s, Budget(n / 4, 0.25));
    for (int h = 0; h < H; ++h) {
      const std::int64_t k = plan.heads[static_cast<std::size_t>(h)].kept();
      const double gate = m.head_gates[static_cast<std::size_t>(l * H + h)];
      kept += k;
      if (k == n) {
        ++whole;
        lowest_whole = std::min(lowest_whole, gate);
      } else {
        highest_streaming = std::max(highest_streaming, gate);
      }
    }
  }
  CHECK(whole >= 1);
  CHECK(kept <= n / 4 * L * H);
  CHECK(kept > n / 4 * L * H - L * H);       // the budget is used, up to rounding
  CHECK(lowest_whole >= highest_streaming);  // whole heads are the highest gates
}
