// The engine --device cuda runs (model/backend_engine.h) tested without a GPU: over the CPU
// reference backend it must behave as the Eigen engine does on SmolLM2 — logits, hooks, the
// mirrored cache, edits to it (per-query-head keep-sets, evictions) and restored snapshots — and
// the device choice must fail clearly where CUDA cannot run; packed (really compressed) entries
// reach the backend, and the mirror holds what it reads back.
#include <catch2/catch.hpp>

#include <filesystem>
#include <numeric>
#include <utility>

#include "model/backend_engine.h"
#include "capture/capture_driver.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "model/llama_model.h"
#include "model/transformer_weights.h"
#include "core/error.h"
#include "core/half.h"
#include "core/packed_kv.h"
#include "gpu/cuda_transformer_ref.h"
#include "policies/codec.h"
#include "policies/lowrank.h"
#include "policies/quantized_tier.h"
#include "trace_fixtures.h"
#include "traces/trace_reader.h"
#include "counting_backend.h"
#include "gguf_fixtures.h"
#include "nmse_check.h"

using namespace kvsim;
using kvsim::test::CountingBackend;
using kvsim::test::nmse;

namespace {

std::unique_ptr<gpu::TransformerBackend> reference_backend(const GgufFile& f) {
  return std::make_unique<gpu::TransformerRef>(model_config(f), gpu::DeviceWeights::F32);
}

// Every layer's hook rows, concatenated.
struct Rows {
  std::vector<float> q, k, v;
  LayerHook hook() {
    return [this](const LayerActivations& a) {
      q.insert(q.end(), a.q.begin(), a.q.end());
      k.insert(k.end(), a.k.begin(), a.k.end());
      v.insert(v.end(), a.v.begin(), a.v.end());
    };
  }
};

void require_same_cache(const KvCache& got, const KvCache& want) {
  REQUIRE(got.seen == want.seen);
  REQUIRE(got.layers.size() == want.layers.size());
  for (std::size_t l = 0; l < got.layers.size(); ++l) {
    REQUIRE(got.layers[l].size() == want.layers[l].size());
    for (std::size_t e = 0; e < got.layers[l].size(); ++e) {
      INFO("layer " << l << " entry " << e);
      REQUIRE(got.layers[l][e].tokens == want.layers[l][e].tokens);
      CHECK(nmse(got.layers[l][e].k, want.layers[l][e].k) < 1e-6);
      CHECK(nmse(got.layers[l][e].v, want.layers[l][e].v) < 1e-6);
    }
  }
}

}  // namespace

TEST_CASE("backend engine over the reference runs SmolLM2 as the CPU engine does", "[backend_engine]") {
  if (!std::filesystem::exists(KVSIM_TEST_MODEL))
    FAIL("SmolLM2 is missing: run scripts/setup.sh (" KVSIM_TEST_MODEL ")");
  const GgufFile gguf(KVSIM_TEST_MODEL);
  LlamaModel cpu(gguf, WeightFormat::F32);
  BackendEngine eng(gguf, reference_backend(gguf));
  CHECK(eng.device() == "cpu reference");
  const ModelConfig& c = cpu.config();
  const std::vector<std::int32_t> prompt = {1,   504,  3458, 282,  4649, 314, 2729, 30,
                                            378, 3458, 282,  4649, 314,  16,  17,   18};

  // Prefill in two chunks with hooks, then two decode steps.
  Rows rc, re;
  const auto lc = cpu.prefill(prompt, 9, rc.hook());
  const auto le = eng.prefill(prompt, 9, re.hook());
  CHECK(nmse(le, lc) < 1e-6);
  CHECK(nmse(re.q, rc.q) < 1e-6);
  CHECK(nmse(re.k, rc.k) < 1e-6);
  CHECK(nmse(re.v, rc.v) < 1e-6);
  for (const std::int32_t t : {42, 7}) CHECK(nmse(eng.step(t), cpu.step(t)) < 1e-6);
  require_same_cache(eng.cache(), cpu.cache());
  const KvCache saved = eng.cache();

  // Compression edits the mirror: per-query-head keep-sets (each head drops other tokens) in
  // every layer, an eviction in one entry; the next step runs on the edited cache.
  for (int l = 0; l < c.n_layers; ++l) {
    std::vector<std::vector<std::int32_t>> keep(static_cast<std::size_t>(c.n_q_heads));
    for (int h = 0; h < c.n_q_heads; ++h)
      for (std::int32_t t = 0; t < static_cast<std::int32_t>(cpu.cached_tokens()); ++t)
        if (t < 2 || (t + h) % 3 != 0) keep[static_cast<std::size_t>(h)].push_back(t);
    cpu.cache().keep(l, keep, c.n_q_heads);
    eng.cache().keep(l, keep, c.n_q_heads);
  }
  const std::vector<std::int32_t> gone = {4};
  cpu.cache().evict(3, 1, gone);
  eng.cache().evict(3, 1, gone);
  cpu.record_last_attention(true);
  eng.record_last_attention(true);
  CHECK(nmse(eng.step(99), cpu.step(99)) < 1e-6);
  for (int l = 0; l < c.n_layers; l += 7)
    for (int h = 0; h < c.n_q_heads; h += 4) {
      INFO("layer " << l << " head " << h);
      CHECK(nmse(eng.last_attention(l, h), cpu.last_attention(l, h)) < 1e-6);
    }
  require_same_cache(eng.cache(), cpu.cache());

  // A restored snapshot continues as the uncompressed run does.
  cpu.set_cache(saved);
  eng.set_cache(saved);
  CHECK(nmse(eng.step(99), cpu.step(99)) < 1e-6);
  require_same_cache(eng.cache(), cpu.cache());

  // A pass that fails part-way (the reference checks logit rows after the layers) leaves the
  // mirror as it was; the next step runs as if it had not happened.
  const std::int64_t before = eng.cached_tokens();
  const std::int32_t tok = 5, at = static_cast<std::int32_t>(before);
  const std::int64_t bad_row = 3;
  CHECK_THROWS_WITH(eng.forward({&tok, 1}, {&at, 1}, {&bad_row, 1}), Catch::Contains("logit row 3 out of range"));
  CHECK(eng.cached_tokens() == before);
  CHECK(nmse(eng.step(tok), cpu.step(tok)) < 1e-6);
  require_same_cache(eng.cache(), cpu.cache());

  // Rows a codec rebuilt (not fp16 values) are held as the backend's fp16 cache holds them.
  KvCache odd = std::as_const(eng).cache();
  for (float& x : odd.layers[0][0].k) x *= 1.0001f;
  eng.set_cache(odd);
  eng.step(7);
  for (const float x : std::span(std::as_const(eng).cache().layers[0][0].k).first(64))
    CHECK(half_to_float(float_to_half(x)) == x);
}

TEST_CASE("backend engine refuses a backend made for another model", "[backend_engine]") {
  if (!std::filesystem::exists(KVSIM_TEST_MODEL))
    FAIL("SmolLM2 is missing: run scripts/setup.sh (" KVSIM_TEST_MODEL ")");
  const GgufFile gguf(KVSIM_TEST_MODEL);
  ModelConfig other = model_config(gguf);
  other.n_layers = 2;
  CHECK_THROWS_WITH(BackendEngine(gguf, std::make_unique<gpu::TransformerRef>(other, gpu::DeviceWeights::F32)),
                    Catch::Contains("made for another model shape") && Catch::Contains("SmolLM2"));
}

TEST_CASE("gemma3: its turns end generation; its block is the backends'", "[backend_engine]") {
  if (!std::filesystem::exists(KVSIM_TEST_GEMMA))
    FAIL("Gemma 3 is missing: run scripts/setup.sh (" KVSIM_TEST_GEMMA ")");
  const GgufFile gguf(KVSIM_TEST_GEMMA);
  const Tokenizer tok(gguf);
  CHECK(tok.is_eog(tok.eos()));
  CHECK(tok.is_eog(tok.encode("<end_of_turn>").at(0)));  // as llama.cpp stops on it
  CHECK_FALSE(tok.is_eog(tok.bos()));
  const ModelConfig c = model_config(gguf);
  CHECK(c.qk_norm);
  CHECK(c.window(0) == 512);
  CHECK(c.window(5) == 0);
  // A backend made for the llama block of the same widths is refused: the block differs.
  ModelConfig llama_block = c;
  llama_block.qk_norm = llama_block.post_norms = false;
  llama_block.ffn_act = FfnAct::Silu;
  CHECK_THROWS_WITH(BackendEngine(gguf, std::make_unique<gpu::TransformerRef>(llama_block, gpu::DeviceWeights::F32)),
                    Catch::Contains("backend was made for another gemma3 block"));
}

TEST_CASE("gemma3 on the backend engine: the CPU engine's logits, cache and weights; no gap inside a window",
          "[backend_engine]") {
  if (!std::filesystem::exists(KVSIM_TEST_GEMMA))
    FAIL("Gemma 3 is missing: run scripts/setup.sh (" KVSIM_TEST_GEMMA ")");
  // Six layers (five local, one global) and a window of 6 tokens: every step below crosses it.
  const std::string path =
      kvsim::test::patched_model(KVSIM_TEST_GEMMA, {{"gemma3.block_count", 6}, {"gemma3.attention.sliding_window", 6}},
                                 "gemma3_window6_engine.gguf");
  const GgufFile gguf(path);
  LlamaModel cpu(gguf, WeightFormat::F32);
  BackendEngine be(gguf, reference_backend(gguf));
  std::vector<std::int32_t> prompt(12), pos(12);
  for (int i = 0; i < 12; ++i)
    prompt[static_cast<std::size_t>(i)] = 3000 + 131 * i, pos[static_cast<std::size_t>(i)] = i;
  const std::span<const std::int32_t> all(prompt), at(pos);
  const auto want = cpu.forward(all, at, std::vector<std::int64_t>{11});
  be.forward(all.first(5), at.first(5), {});
  CHECK(nmse(be.forward(all.subspan(5), at.subspan(5), std::vector<std::int64_t>{6}), want) < 1e-6);
  require_same_cache(be.cache(), cpu.cache());

  // Evictions a policy may make: any rows of the global layer, a local layer's rows older than its
  // window. Then decode, with the last row's weights.
  for (Engine* e : {static_cast<Engine*>(&cpu), static_cast<Engine*>(&be)}) {
    e->evict(5, 0, std::vector<std::int32_t>{2, 3, 9});
    e->evict(0, 0, std::vector<std::int32_t>{0, 1, 2});
    e->record_last_attention(true);
  }
  for (std::int32_t t = 0; t < 3; ++t) {
    const std::vector<std::int32_t> one{4000 + 7 * t}, p{12 + t};
    const std::vector<std::int64_t> row0{0};
    INFO("decode step " << t);
    CHECK(nmse(be.forward(one, p, row0), cpu.forward(one, p, row0)) < 1e-6);
    for (int layer : {0, 1, 5}) CHECK(nmse(be.last_attention(layer, 3), cpu.last_attention(layer, 3)) < 1e-6);
  }
  require_same_cache(be.cache(), cpu.cache());

  // A decode rule may not start on a local layer (it would evict inside the window).
  CHECK_THROWS_WITH(be.start_decode_rule(2, DecodeRuleStart{DecodeRule{false, false, HeadCombine::Sum, 1}, {}}),
                    Catch::Contains("layer 2 is a sliding-window layer (window 6)"));
  // A gap inside a local layer's window: the backends mask by row, so this is refused by name.
  be.evict(1, 0, std::vector<std::int32_t>{13});
  const KvCache before = be.cache();
  CHECK_THROWS_WITH(
      be.forward(std::vector<std::int32_t>{5}, std::vector<std::int32_t>{15}, std::vector<std::int64_t>{0}),
      Catch::Contains("KV cache layer 1 entry 0: a sliding-window layer (window 6)") &&
          Catch::Contains("--device cpu"));
  require_same_cache(be.cache(), before);
}

TEST_CASE("device choice: names, and a clear refusal where CUDA cannot run", "[backend_engine]") {
  CHECK(parse_device("cpu") == Device::Cpu);
  CHECK(parse_device("cuda") == Device::Cuda);
  CHECK_THROWS_WITH(parse_device("gpu"), "--device is 'gpu', expected cpu or cuda");
  CHECK_NOTHROW(require_device(Device::Cpu));
  std::string refusal;
  try {
    require_device(Device::Cuda);
  } catch (const Error& e) {
    refusal = e.what();
  }
  if (refusal.empty()) {
    CHECK(cuda_built());  // only a CUDA build can accept --device cuda
  } else {
    if (cuda_built())
      CHECK_THAT(refusal, Catch::Contains("--device cuda: no CUDA device is visible"));
    else
      CHECK_THAT(refusal, Catch::Contains("--device cuda: this kvsim was built without CUDA"));
    CHECK_THAT(refusal, Catch::Contains("use --device cpu"));
  }
}

TEST_CASE("backend engine evicts on the backend without reloading the cache", "[backend_engine]") {
  if (!std::filesystem::exists(KVSIM_TEST_MODEL))
    FAIL("SmolLM2 is missing: run scripts/setup.sh (" KVSIM_TEST_MODEL ")");
  const GgufFile gguf(KVSIM_TEST_MODEL);
  LlamaModel cpu(gguf, WeightFormat::F32);
  auto counting = std::make_unique<CountingBackend>(model_config(gguf), gpu::DeviceWeights::F32);
  CountingBackend* backend = counting.get();
  BackendEngine eng(gguf, std::move(counting));
  const std::vector<std::int32_t> prompt = {1, 504, 3458, 282, 4649, 314, 2729, 30, 378, 3458, 282, 4649};
  cpu.prefill(prompt);
  eng.prefill(prompt);
  // A decode-time policy's step: a different token out of every entry of every layer.
  const int layers = cpu.config().n_layers, kv_heads = cpu.config().n_kv_heads;
  for (int l = 0; l < layers; ++l)
    for (int e = 0; e < kv_heads; ++e) {
      const std::int32_t t = 1 + (l + e) % 10;
      cpu.evict(l, e, {&t, 1});
      eng.evict(l, e, {&t, 1});
    }
  CHECK(backend->loads == 0);
  CHECK(backend->compactions == layers * kv_heads);
  cpu.record_last_attention(true);
  eng.record_last_attention(true);
  CHECK(nmse(eng.step(42), cpu.step(42)) < 1e-6);
  CHECK(nmse(eng.last_attention(5, 4), cpu.last_attention(5, 4)) < 1e-6);
  require_same_cache(eng.cache(), cpu.cache());
  CHECK(backend->loads == 0);
  // A token that is not cached is refused before anything changes.
  const std::int32_t gone = 1 + (0 + 0) % 10;
  CHECK_THROWS_WITH(eng.evict(0, 0, {&gone, 1}), Catch::Contains("cannot evict token 1"));
  CHECK(nmse(eng.step(43), cpu.step(43)) < 1e-6);
}

TEST_CASE("backend engine hands packed entries to the backend, whose read-back the mirror holds", "[backend_engine]") {
  if (!std::filesystem::exists(KVSIM_TEST_MODEL))
    FAIL("SmolLM2 is missing: run scripts/setup.sh (" KVSIM_TEST_MODEL ")");
  const GgufFile gguf(KVSIM_TEST_MODEL);
  LlamaModel cpu(gguf, WeightFormat::F32);
  auto owned = std::make_unique<CountingBackend>(model_config(gguf), gpu::DeviceWeights::F32);
  CountingBackend* backend = owned.get();
  BackendEngine eng(gguf, std::move(owned));
  const ModelConfig& c = cpu.config();
  const ModelGeometry& g = c;
  const std::vector<std::int32_t> prompt = {1,   504,  3458, 282,  4649, 314, 2729, 30,
                                            378, 3458, 282,  4649, 314,  16,  17,   18};
  cpu.prefill(prompt);
  eng.prefill(prompt);
  // Every entry: the first two tokens fp16, the rest int4 (even layers) or rank-8 low rank (odd
  // layers), packed from the exact rows; both engines then hold the codec's reconstruction.
  const IntCodec int4(IntSpec{4, 32, false});
  const LowRankCodec lowrank;
  std::vector<std::vector<PackedEntry>> packed(static_cast<std::size_t>(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l)
    for (int e = 0; e < c.n_kv_heads; ++e) {
      KvEntry& mine = eng.cache().layers[static_cast<std::size_t>(l)][static_cast<std::size_t>(e)];
      KvEntry& theirs = cpu.cache().layers[static_cast<std::size_t>(l)][static_cast<std::size_t>(e)];
      const KvCodec& codec = l % 2 == 0 ? static_cast<const KvCodec&>(int4) : lowrank;
      HeadPlan plan;
      plan.codec.assign(mine.tokens.size(), l % 2 == 0 ? TokenCodec::Int4 : TokenCodec::LowRank);
      plan.codec[0] = plan.codec[1] = TokenCodec::Fp16;
      if (l % 2 == 1) plan.rank.assign(mine.tokens.size(), 8);
      auto p = std::make_shared<PackedEntry>();
      pack_plan(&codec, plan, g, mine.tokens, mine.k, mine.v, *p);
      codec.reconstruct(plan, g, mine.tokens, mine.k, mine.v);
      mine.packed = p;
      packed[static_cast<std::size_t>(l)].push_back(*p);
      // The CPU engine gets the stored form's read-back (what the backend must attend over): a
      // cache this compressed turns fp16-level row differences into 1e-4 logit differences.
      unpack_tensor(p->k, c.head_dim, c.rope, theirs.k);
      unpack_tensor(p->v, c.head_dim, c.rope, theirs.v);
    }
  const int loads = backend->loads;
  CHECK(nmse(eng.step(42), cpu.step(42)) < 1e-6);
  CHECK(backend->loads == loads + c.n_layers);
  CHECK(backend->packed == c.n_layers * c.n_kv_heads);
  // The mirror's packed rows are the stored form's read-back, exactly; the new row is fp16.
  for (int l = 0; l < c.n_layers; l += 5) {
    const KvEntry& en = std::as_const(eng).cache().layers[static_cast<std::size_t>(l)][1];
    std::vector<float> k, v;
    unpack_tensor(packed[static_cast<std::size_t>(l)][1].k, c.head_dim, c.rope, k);
    unpack_tensor(packed[static_cast<std::size_t>(l)][1].v, c.head_dim, c.rope, v);
    INFO("layer " << l);
    CHECK(std::vector<float>(en.k.begin(), en.k.begin() + static_cast<std::ptrdiff_t>(k.size())) == k);
    CHECK(std::vector<float>(en.v.begin(), en.v.begin() + static_cast<std::ptrdiff_t>(v.size())) == v);
    CHECK(en.rows() == static_cast<std::int64_t>(prompt.size()) + 1);
  }
  CHECK(nmse(eng.step(7), cpu.step(7)) < 1e-6);  // decode continues on the packed prefix
  CHECK(backend->loads == loads + c.n_layers);
  // Evicting from a packed entry drops its packed form (it no longer lines up) and reloads.
  const std::int32_t t = 3;
  eng.evict(2, 0, {&t, 1});
  cpu.evict(2, 0, {&t, 1});
  CHECK(std::as_const(eng).cache().layers[2][0].packed == nullptr);
  CHECK(backend->compactions == 0);
  CHECK(nmse(eng.step(9), cpu.step(9)) < 1e-6);
  CHECK(backend->loads == loads + 2 * c.n_layers);
  // A packed form for another geometry is refused, naming the layer.
  auto wrong = std::make_shared<PackedEntry>(packed[4][0]);
  wrong->head_dim = c.head_dim / 2;
  eng.cache().layers[4][0].packed = wrong;
  CHECK_THROWS_WITH(eng.step(11), Catch::Contains("KV cache layer 4: a packed entry"));
}

TEST_CASE(
    "capture on the backend engine (the --device cuda path, over the CPU reference) writes the CPU engine's trace",
    "[backend_engine]") {
  if (!std::filesystem::exists(KVSIM_TEST_MODEL))
    FAIL("SmolLM2 is missing: run scripts/setup.sh (" KVSIM_TEST_MODEL ")");
  CaptureRequest req;
  req.id = "r";
  req.context = "The key to the blue door is under the third stone of the garden wall, next to the old well.";
  req.question = "Where is the key to the blue door?";
  CaptureOptions o;
  o.model_path = KVSIM_TEST_MODEL;
  o.overwrite = true;
  o.max_new = 4;
  o.all_queries = true;
  o.prefill_chunk = 16;  // several chunks, as a long prompt would
  o.weights = WeightFormat::F32;
  o.out_path = test::scratch_file("capture_cpu.h5");
  run_capture({req}, o);
  o.out_path = test::scratch_file("capture_backend.h5");
  int engines = 0;
  run_capture({req}, o, [&](const GgufFile& f) {
    ++engines;
    return std::make_unique<BackendEngine>(f, reference_backend(f));
  });
  CHECK(engines == 1);
  const TraceReader want(test::scratch_file("capture_cpu.h5")), got(test::scratch_file("capture_backend.h5"));
  const RequestHeader hw = want.header("r"), hg = got.header("r");
  CHECK(hg.tokens == hw.tokens);  // the same greedy continuation
  CHECK(hg.positions == hw.positions);
  CHECK(hg.segments == hw.segments);
  CHECK(hg.q_index == hw.q_index);
  // The trace's configuration names the engine that wrote it.
  CHECK(got.capture().config.find("\"device\":\"cpu reference\"") != std::string::npos);
  CHECK(want.capture().config.find("\"device\":\"cpu\"") != std::string::npos);
  for (int layer = 0; layer < want.geometry().n_layers; ++layer) {
    INFO("layer " << layer);
    for (const Tensor t : {Tensor::K, Tensor::V, Tensor::Q}) {
      std::vector<float> a(want.layer_elements("r", t)), b(got.layer_elements("r", t));
      want.read_layer("r", t, layer, a);
      got.read_layer("r", t, layer, b);
      CHECK(nmse(b, a) < 1e-6);
    }
  }
  const ReferenceDistribution rw = want.reference("r"), rg = got.reference("r");
  REQUIRE(rg.rows == rw.rows);
  CHECK(rg.index == rw.index);
  for (std::int32_t row = 0; row < rw.rows; ++row) {
    INFO("reference row " << row);
    CHECK(rg.topk_ids[static_cast<std::size_t>(row * rw.topk)] == rw.topk_ids[static_cast<std::size_t>(row * rw.topk)]);
    // Logits agree to NMSE 1e-6 (tests above): a logsumexp near 30 to about 1e-2.
    CHECK(rg.lse[static_cast<std::size_t>(row)] == Approx(rw.lse[static_cast<std::size_t>(row)]).epsilon(1e-3));
  }
}

TEST_CASE("backend engine: decode rules start at the next pass, step on the backend and end at an edit",
          "[backend_engine]") {
  if (!std::filesystem::exists(KVSIM_TEST_MODEL))
    FAIL("SmolLM2 is missing: run scripts/setup.sh (" KVSIM_TEST_MODEL ")");
  const GgufFile gguf(KVSIM_TEST_MODEL);
  BackendEngine eng(gguf, reference_backend(gguf));
  const int L = eng.config().n_layers;
  std::vector<std::int32_t> prompt(12);
  std::iota(prompt.begin(), prompt.end(), 100);
  eng.prefill(prompt);
  const DecodeRuleStart tova{DecodeRule{false, true, HeadCombine::Sum, 1}, {}};
  auto start_all = [&] {
    for (int l = 0; l < L; ++l) eng.start_decode_rule(l, tova);
  };
  CHECK_THROWS_WITH(eng.decode_rule_step(10), Catch::Contains("no decode rule is running"));
  start_all();
  CHECK_THROWS_WITH(eng.decode_rule_step(10), Catch::Contains("no decode rule is running"));  // pending until a pass
  eng.step(5);
  auto gone = eng.decode_rule_step(10);  // 13 rows: three go, the same from every entry, mirror included
  for (int l = 0; l < L; ++l)
    for (std::size_t e = 0; e < gone[static_cast<std::size_t>(l)].size(); ++e) {
      INFO("layer " << l << " entry " << e);
      const auto& g = gone[static_cast<std::size_t>(l)][e];
      CHECK(g.size() == 3);
      CHECK(g == gone[static_cast<std::size_t>(l)][0]);
      const auto& tokens = std::as_const(eng).cache().layers[static_cast<std::size_t>(l)][e].tokens;
      CHECK(tokens.size() == 10);
      for (const auto t : g) CHECK(std::find(tokens.begin(), tokens.end(), t) == tokens.end());
      CHECK(tokens.back() == 12);  // the newest token is protected
    }
  // Once per pass; a refused step leaves the rules running.
  CHECK_THROWS_WITH(eng.decode_rule_step(10), Catch::Contains("no one-row forward"));
  eng.step(6);
  gone = eng.decode_rule_step(10);
  CHECK(gone[0][0].size() == 1);
  const std::int32_t cached = std::as_const(eng).cache().layers[0][0].tokens[0];
  CHECK_THROWS_WITH(eng.evict(0, 0, std::vector<std::int32_t>{cached}), Catch::Contains("evicts by its decode rule"));
  // An edit ends them, running or pending.
  eng.cache();
  eng.step(7);
  CHECK_THROWS_WITH(eng.decode_rule_step(10), Catch::Contains("no decode rule is running"));
  start_all();
  eng.cache();
  eng.step(8);
  CHECK_THROWS_WITH(eng.decode_rule_step(10), Catch::Contains("no decode rule is running"));
  // A rule that does not fit the cache is refused at the pass that would start it; none starts,
  // and the pass after that runs.
  start_all();
  eng.start_decode_rule(3, DecodeRuleStart{DecodeRule{}, {{1.0}}});  // H2O-like scores for one entry of three
  CHECK_THROWS_WITH(eng.step(9), Catch::Contains("scores for 1 entries, expected 3"));
  const std::int64_t seen = eng.cached_tokens();
  eng.step(9);
  CHECK(eng.cached_tokens() == seen + 1);
  CHECK_THROWS_WITH(eng.decode_rule_step(10), Catch::Contains("no decode rule is running"));
}

TEST_CASE("KV cache eviction compacts an entry in place, any order and repeats allowed", "[backend_engine]") {
  KvCache c;
  c.head_dim = 2;
  c.clear(1, 1);
  KvEntry& e = c.layers[0][0];
  for (std::int32_t t = 0; t < 8; ++t) {
    e.tokens.push_back(t * 10);
    e.k.insert(e.k.end(), {static_cast<float>(t), static_cast<float>(t) + 0.5f});
    e.v.insert(e.v.end(), {-static_cast<float>(t), -static_cast<float>(t) - 0.5f});
  }
  e.packed = std::make_shared<PackedEntry>();
  const float* storage = e.k.data();
  c.evict(0, 0, std::vector<std::int32_t>{70, 20, 0, 20});  // the last, a middle one (twice), the first
  CHECK(e.tokens == std::vector<std::int32_t>{10, 30, 40, 50, 60});
  CHECK(e.k == std::vector<float>{1, 1.5f, 3, 3.5f, 4, 4.5f, 5, 5.5f, 6, 6.5f});
  CHECK(e.v == std::vector<float>{-1, -1.5f, -3, -3.5f, -4, -4.5f, -5, -5.5f, -6, -6.5f});
  CHECK(e.k.data() == storage);  // no new entry
  CHECK_FALSE(e.packed);         // an edit that removes rows drops the packed form
  CHECK_THROWS_WITH(c.evict(0, 0, std::vector<std::int32_t>{30, 35}), Catch::Contains("cannot evict token 35"));
  CHECK(e.tokens.size() == 5);  // a refused eviction changes nothing
  c.evict(0, 0, std::vector<std::int32_t>{60, 50, 40, 30, 10});
  CHECK(e.tokens.empty());
  CHECK(e.k.empty());
}

TEST_CASE("soft gating: logit biases scale attention on the CPU engine; the backend refuses them", "[backend_engine]") {
  if (!std::filesystem::exists(KVSIM_TEST_MODEL))
    FAIL("SmolLM2 is missing: run scripts/setup.sh (" KVSIM_TEST_MODEL ")");
  const GgufFile gguf(KVSIM_TEST_MODEL);
  const std::vector<std::int32_t> prompt = {1, 504, 3458, 282, 4649, 314, 2729, 30, 378, 3458, 282, 4649};
  LlamaModel plain(gguf, WeightFormat::F32), biased(gguf, WeightFormat::F32), evicted(gguf, WeightFormat::F32);
  for (LlamaModel* m : {&plain, &biased, &evicted}) m->prefill(prompt);
  const int layers = plain.config().n_layers, kv_heads = plain.config().n_kv_heads;
  const auto n = prompt.size();
  // A very negative bias on token 3 is its eviction; a bias of 0 changes nothing. Rows appended
  // later join with bias 0.
  for (int l = 0; l < layers; ++l)
    for (int e = 0; e < kv_heads; ++e) {
      std::vector<float> bias(n, 0.0f);
      bias[3] = -1e4f;
      biased.cache().layers[static_cast<std::size_t>(l)][static_cast<std::size_t>(e)].bias = bias;
      const std::int32_t t = 3;
      evicted.evict(l, e, {&t, 1});
    }
  const std::vector<float> want = evicted.step(42);
  CHECK(nmse(biased.step(42), want) < 1e-6);
  CHECK(nmse(plain.step(42), want) > 1e-6);  // the test can fail: token 3 matters
  const KvEntry& entry = biased.cache().layers[0][0];
  REQUIRE(entry.bias.size() == n + 1);
  CHECK(entry.bias.back() == 0.0f);
  // Keep and evict carry the biases with their rows.
  KvCache copy = biased.cache();
  copy.evict(0, 0, std::vector<std::int32_t>{0, 3});
  CHECK(copy.layers[0][0].bias.size() == n - 1);
  CHECK(copy.layers[0][0].bias[0] == 0.0f);
  copy.layers[1][0].bias[2] = 0.5f;
  copy.keep(1, {{1, 2, 12}, {3}, {4}}, plain.config().n_q_heads);
  CHECK(copy.layers[1][0].bias == std::vector<float>{0.0f, 0.5f, 0.0f});
  CHECK(copy.layers[1][1].bias == std::vector<float>{-1e4f});
  // The backend engine refuses a biased cache, naming the way out.
  BackendEngine eng(gguf, reference_backend(gguf));
  eng.prefill(prompt);
  eng.cache().layers[2][1].bias.assign(n, 0.0f);
  CHECK_THROWS_WITH(eng.step(42), Catch::Contains("run on the CPU engine only"));
}
