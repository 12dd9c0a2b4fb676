// Chunk reuse in live verify (verify/chunk_reuse.h, docs/chunk-states.md): recompute and a
// transition of every token give the full cache's run exactly; stateless reuse moves a chunk's
// keys and keeps the first chunk's own state; refused without chunks or query-aware.
#include <catch2/catch.hpp>

#include <numeric>

#include "capture/chunked_tasks.h"
#include "core/error.h"
#include "gguf_fixtures.h"
#include "model/engine.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "prompts/prompt.h"
#include "verify/chunk_reuse.h"
#include "verify/live_verifier.h"

using namespace kvsim;

namespace {

std::string small_model() {
  return test::patched_model(KVSIM_TEST_MODEL, {{"llama.block_count", 4}}, "smollm2_4l_reuse.gguf");
}

CaptureRequest rag_request() {
  ChunkedSpec spec;
  spec.requests = 1;
  spec.pool = 3;
  spec.per_request = 3;
  spec.chunk_tokens = 48;
  spec.file = "/usr/share/common-licenses/GPL-3";
  return make_chunked_tasks(spec).front();
}

}  // namespace

TEST_CASE("chunk reuse: recompute and a full transition are the full cache; stateless is not", "[verify]") {
  const GgufFile gguf(small_model());
  VerifyOptions o;
  o.mode = ReplayMode::QueryAgnostic;
  o.max_new = 8;
  LiveVerifier verifier(gguf, o);
  const std::vector<ReuseConfig> ways = {parse_reuse("recompute"), parse_reuse("transition:share=1"),
                                         parse_reuse("stateless"), parse_reuse("transition:share=0.5")};
  const LiveRequestResult r = verifier.run(rag_request(), {}, ways);
  REQUIRE(r.configs.size() == 4);
  CHECK(r.configs[0].mean_kl == 0);
  CHECK(r.configs[0].same_tokens);
  CHECK(r.configs[1].mean_kl == 0);  // bit for bit: the same passes over the same rows
  CHECK(r.configs[1].same_tokens);
  CHECK(r.configs[2].mean_kl > 0);
  CHECK(r.configs[3].mean_kl >= 0);
  CHECK(r.configs[2].steps == r.configs[0].steps);

  CaptureRequest plain = rag_request();
  plain.chunks.clear();
  CHECK_THROWS_WITH(verifier.run(plain, {}, ways), Catch::Contains("--chunk-reuse needs chunked requests"));
  o.mode = ReplayMode::QueryAware;
  LiveVerifier aware(gguf, o);
  CHECK_THROWS_WITH(aware.run(rag_request(), {}, ways), Catch::Contains("--mode query-agnostic"));
}

TEST_CASE("stateless reuse: the first chunk keeps its own state, a moved chunk its alone keys rotated", "[verify]") {
  const GgufFile gguf(small_model());
  const Tokenizer tok(gguf);
  const Prompt p = build_prompt(tok, rag_request(), default_system_prompt(gguf));
  REQUIRE(p.chunks.size() == 3);
  const auto engine = make_engine(gguf, EngineOptions{});
  const std::int64_t c = p.question_start;
  for (const auto& [b, e] : prefill_chunks(c, prompt_splits(p), 256)) {
    std::vector<std::int32_t> pos(static_cast<std::size_t>(e - b));
    std::iota(pos.begin(), pos.end(), static_cast<std::int32_t>(b));
    engine->forward(std::span(p.tokens).subspan(static_cast<std::size_t>(b), static_cast<std::size_t>(e - b)), pos, {});
  }
  const KvCache full = engine->cache();
  ChunkStates states(*engine, 256);
  ReuseStats stats;
  const KvCache got = states.serve(p, c, full, parse_reuse("stateless"), stats, "test");
  CHECK(stats.chunk_tokens == c - p.chunks.front().begin);
  CHECK(stats.recomputed == 0);
  const auto d = static_cast<std::size_t>(full.head_dim);
  auto rows = [&](const std::vector<float>& v, const ChunkSpan& s) {
    return std::vector<float>(v.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(s.begin) * d),
                              v.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(s.end) * d));
  };
  for (std::size_t l = 0; l < full.layers.size(); ++l)
    for (std::size_t e = 0; e < full.layers[l].size(); ++e) {
      const KvEntry &want = full.layers[l][e], &have = got.layers[l][e];
      // Alone, the first chunk is in its own state: the same passes, the same rows.
      CHECK(rows(have.k, p.chunks[0]) == rows(want.k, p.chunks[0]));
      CHECK(rows(have.v, p.chunks[0]) == rows(want.v, p.chunks[0]));
      if (l > 0) continue;
      // Layer 0 does not see the context: a moved chunk's values are its own, its keys the same
      // up to the rotation's rounding.
      CHECK(rows(have.v, p.chunks[2]) == rows(want.v, p.chunks[2]));
      const auto hk = rows(have.k, p.chunks[2]), wk = rows(want.k, p.chunks[2]);
      for (std::size_t j = 0; j < hk.size(); ++j) REQUIRE(hk[j] == Approx(wk[j]).margin(1e-2 + 2e-3 * std::abs(wk[j])));
    }
  // Above layer 0 the moved chunk's state differs from its state in context.
  CHECK(rows(got.layers[2][0].k, p.chunks[2]) != rows(full.layers[2][0].k, p.chunks[2]));
}
