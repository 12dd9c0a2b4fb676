// The CPU engine's refresh of cached rows (model/cache_refresh.cpp), CacheBlend's selective
// recompute: a refresh of every row is prefill bit for bit under the same chunking (SmolLM2, and
// Gemma 3 with its sliding windows); a refresh of no row leaves the layers above the select
// layer as they were; the rows a stale state changed are the ones the deviation selects; a
// compressed cache and the backend engine are refused by name.
#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "gguf_fixtures.h"
#include "model/engine.h"
#include "model/gguf.h"

using namespace kvsim;

namespace {

constexpr std::int64_t kPrefix = 100, kTokens = 300;  // rows [kPrefix, kTokens) are refreshed

std::vector<std::int32_t> some_tokens() {
  std::vector<std::int32_t> t(kTokens);
  for (std::int64_t i = 0; i < kTokens; ++i)
    t[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(100 + (i * 7919) % 5000);
  return t;
}

// Prefill in chunks that restart at kPrefix: [0, 100), [100, 256), [256, 300).
KvCache prefilled(Engine& e, const std::vector<std::int32_t>& tokens) {
  e.reset();
  for (const auto& [b, end] :
       std::vector<std::pair<std::int64_t, std::int64_t>>{{0, kPrefix}, {kPrefix, 256}, {256, kTokens}}) {
    std::vector<std::int32_t> pos(static_cast<std::size_t>(end - b));
    std::iota(pos.begin(), pos.end(), static_cast<std::int32_t>(b));
    e.forward(std::span(tokens).subspan(static_cast<std::size_t>(b), static_cast<std::size_t>(end - b)), pos, {});
  }
  return e.cache();
}

// The refreshed rows' K/V moved, as another context would have left them: every layer, or one.
KvCache stale(KvCache c, int only_layer = -1, std::int64_t from = kPrefix, std::int64_t to = kTokens) {
  for (std::size_t l = 0; l < c.layers.size(); ++l) {
    if (only_layer >= 0 && static_cast<int>(l) != only_layer) continue;
    for (KvEntry& e : c.layers[l])
      for (std::int64_t r = from; r < to; ++r)
        for (int j = 0; j < c.head_dim; ++j) {
          e.k[static_cast<std::size_t>(r * c.head_dim + j)] += 0.25f * static_cast<float>((r + j) % 3 - 1);
          e.v[static_cast<std::size_t>(r * c.head_dim + j)] -= 0.125f;
        }
  }
  return c;
}

RefreshResult refresh_rows(Engine& e, const std::vector<std::int32_t>& tokens, const RefreshOptions& o) {
  std::vector<std::int32_t> pos(static_cast<std::size_t>(kTokens - kPrefix));
  std::iota(pos.begin(), pos.end(), static_cast<std::int32_t>(kPrefix));
  std::vector<std::int64_t> idx(pos.begin(), pos.end());
  return e.refresh(std::span(tokens).subspan(static_cast<std::size_t>(kPrefix)), pos, idx, o);
}

bool same_layer(const KvCache& a, const KvCache& b, std::size_t l) {
  for (std::size_t e = 0; e < a.layers[l].size(); ++e)
    if (a.layers[l][e].tokens != b.layers[l][e].tokens || a.layers[l][e].k != b.layers[l][e].k ||
        a.layers[l][e].v != b.layers[l][e].v)
      return false;
  return true;
}

void check_full_refresh_is_prefill(const std::string& model) {
  const GgufFile gguf(model);
  const auto engine = make_engine(gguf, EngineOptions{});
  const std::vector<std::int32_t> tokens = some_tokens();
  const KvCache want = prefilled(*engine, tokens);
  engine->set_cache(stale(want));
  RefreshOptions o;
  o.batches = {{0, 256 - kPrefix}, {256 - kPrefix, kTokens - kPrefix}};  // prefill's chunks, as rows
  const RefreshResult r = refresh_rows(*engine, tokens, o);
  CHECK(r.selected.size() == static_cast<std::size_t>(kTokens - kPrefix));
  CHECK(*std::min_element(r.deviation.begin(), r.deviation.end()) > 0);  // every row was stale
  for (std::size_t l = 0; l < want.layers.size(); ++l) {
    INFO("layer " << l);
    CHECK(same_layer(engine->cache(), want, l));
  }
}

}  // namespace

TEST_CASE("a refresh of every row is prefill bit for bit under the same chunking", "[refresh]") {
  SECTION("SmolLM2, 4 layers") {
    check_full_refresh_is_prefill(
        test::patched_model(KVSIM_TEST_MODEL, {{"llama.block_count", 4}}, "smollm2_4l_refresh.gguf"));
  }
  SECTION("Gemma 3, 6 layers, windows of 16") {
    check_full_refresh_is_prefill(
        test::patched_model(KVSIM_TEST_GEMMA, {{"gemma3.block_count", 6}, {"gemma3.attention.sliding_window", 16}},
                            "gemma3_6l_refresh.gguf"));
  }
}

TEST_CASE("a refresh selects by deviation and leaves unselected rows as cached above the select layer", "[refresh]") {
  const GgufFile gguf(test::patched_model(KVSIM_TEST_MODEL, {{"llama.block_count", 4}}, "smollm2_4l_refresh.gguf"));
  const auto engine = make_engine(gguf, EngineOptions{});
  const std::vector<std::int32_t> tokens = some_tokens();
  const KvCache want = prefilled(*engine, tokens);
  RefreshOptions o;
  o.batches = {{0, 256 - kPrefix}, {256 - kPrefix, kTokens - kPrefix}};

  SECTION("no row selected: layers up to the select layer exact, the rest as cached") {
    const KvCache old = stale(want);
    engine->set_cache(old);
    o.select = [](const std::vector<double>&) { return std::vector<std::int64_t>{}; };
    CHECK(refresh_rows(*engine, tokens, o).selected.empty());
    CHECK(same_layer(engine->cache(), want, 0));
    CHECK(same_layer(engine->cache(), want, 1));
    CHECK(same_layer(engine->cache(), old, 2));
    CHECK(same_layer(engine->cache(), old, 3));
  }
  SECTION("the rows a stale state moved at the select layer have the largest deviation, the rest none") {
    engine->set_cache(stale(want, 1, 150, 160));
    std::vector<std::int64_t> top;
    o.select = [&](const std::vector<double>& dev) {
      std::vector<std::int64_t> rows(dev.size());
      std::iota(rows.begin(), rows.end(), 0);
      std::partial_sort(rows.begin(), rows.begin() + 10, rows.end(), [&](auto a, auto b) {
        return dev[static_cast<std::size_t>(a)] > dev[static_cast<std::size_t>(b)];
      });
      top.assign(rows.begin(), rows.begin() + 10);
      std::sort(top.begin(), top.end());
      for (std::size_t i = 0; i < dev.size(); ++i)
        if (i + kPrefix < 150 || i + kPrefix >= 160) CHECK(dev[i] == 0);
      return top;
    };
    refresh_rows(*engine, tokens, o);
    std::vector<std::int64_t> want_rows(10);
    std::iota(want_rows.begin(), want_rows.end(), 150 - kPrefix);
    CHECK(top == want_rows);
    // Only they were stale: below and at the select layer every row is exact; above it the rest
    // are untouched and they are recomputed in a batch of their own, so equal up to rounding.
    CHECK(same_layer(engine->cache(), want, 0));
    CHECK(same_layer(engine->cache(), want, 1));
    for (std::size_t l = 2; l < 4; ++l)
      for (std::size_t e = 0; e < want.layers[l].size(); ++e) {
        const KvEntry &got = engine->cache().layers[l][e], &ref = want.layers[l][e];
        for (std::size_t j = 0; j < ref.k.size(); ++j) {
          const auto row = static_cast<std::int64_t>(j / static_cast<std::size_t>(want.head_dim));
          if (row >= 150 && row < 160) {
            REQUIRE(got.k[j] == Approx(ref.k[j]).margin(2e-2));
            REQUIRE(got.v[j] == Approx(ref.v[j]).margin(2e-2));
          } else {
            REQUIRE(got.k[j] == ref.k[j]);
            REQUIRE(got.v[j] == ref.v[j]);
          }
        }
      }
  }
  SECTION("refused: a compressed cache, selected rows out of order") {
    engine->set_cache(want);
    engine->evict(2, 0, std::vector<std::int32_t>{200});
    CHECK_THROWS_WITH(refresh_rows(*engine, tokens, o), Catch::Contains("token 200 is not cached in layer 2"));
    engine->set_cache(want);
    o.select = [](const std::vector<double>&) { return std::vector<std::int64_t>{5, 3}; };
    CHECK_THROWS_WITH(refresh_rows(*engine, tokens, o), Catch::Contains("expected increasing rows"));
  }
}
