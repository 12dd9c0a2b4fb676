// The CPU reference of the CUDA transformer (gpu/cuda_transformer_ref.h) is the parity harness's
// ground truth, so it is itself held against the Eigen engine (model/llama_model.h) on the real
// SmolLM2 weights, and checked for the properties the GPU path relies on: chunking does not change
// the result, the per-query-head cache layout reads the same rows, fp16 weights stay close to f32.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <random>
#include <stdexcept>

#include "model/gguf.h"
#include "model/llama_model.h"
#include "model/transformer_weights.h"
#include "core/error.h"
#include "core/packed_kv.h"
#include "gpu/parity/parity_shapes.h"
#include "gpu/parity/random_inputs.h"
#include "gpu/parity/random_packed.h"
#include "gpu/cuda_transformer_ref.h"
#include "gguf_fixtures.h"
#include "nmse_check.h"

using namespace kvsim;
using kvsim::test::nmse;
using namespace kvsim::gpu;

namespace {

ModelConfig tiny_shape(RopeType rope, bool bias) {
  ModelConfig s;
  s.n_layers = 3;
  s.n_embd = 48;
  s.n_q_heads = 6;
  s.n_kv_heads = 2;
  s.head_dim = 8;
  s.n_ff = 96;
  s.vocab = 101;
  s.rope = {rope, s.head_dim, s.head_dim, 10000.0};
  s.qkv_bias = bias;
  return s;
}

std::vector<std::int32_t> iota_tokens(std::int32_t n, std::int32_t first, std::int32_t stride, std::int64_t vocab) {
  std::vector<std::int32_t> t(static_cast<std::size_t>(n));
  for (std::int32_t i = 0; i < n; ++i)
    t[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((first + i * stride) % vocab);
  return t;
}

std::vector<std::int32_t> positions(std::int32_t from, std::int32_t n) {
  std::vector<std::int32_t> p(static_cast<std::size_t>(n));
  std::iota(p.begin(), p.end(), from);
  return p;
}

}  // namespace

TEST_CASE("reference transformer matches the CPU engine on SmolLM2", "[transformer_ref]") {
  if (!std::filesystem::exists(KVSIM_TEST_MODEL))
    FAIL("SmolLM2 is missing: run scripts/setup.sh (" KVSIM_TEST_MODEL ")");
  const GgufFile gguf(KVSIM_TEST_MODEL);
  LlamaModel engine(gguf, WeightFormat::F32);
  const ModelConfig s = engine.config();
  TransformerRef ref(s, DeviceWeights::F32);
  load_transformer_weights(gguf, s, ref.sink());

  const std::vector<std::int32_t> prompt = iota_tokens(12, 1000, 977, s.vocab);
  const std::vector<std::int64_t> last{11};
  std::vector<float> k0_engine, k0_ref;
  const auto want = engine.forward(prompt, positions(0, 12), last, [&](const LayerActivations& a) {
    if (a.layer == 0) k0_engine.assign(a.k.begin(), a.k.end());
  });
  const auto got = ref.forward(prompt, positions(0, 12), last, false, false, [&](const LayerRows& r) {
    if (r.layer == 0) k0_ref.assign(r.k, r.k + r.n * s.kv_dim());
  });
  CHECK(nmse(k0_ref, k0_engine) < 1e-6);
  CHECK(nmse(got, want) < 1e-6);

  // Two decode steps, with the last row's attention the decode-time policies read.
  engine.record_last_attention(true);
  for (std::int32_t t = 0; t < 2; ++t) {
    const std::int32_t tok = 4242 + 17 * t;
    const auto w = engine.forward(std::vector<std::int32_t>{tok}, positions(12 + t, 1), std::vector<std::int64_t>{0});
    const auto g =
        ref.forward(std::vector<std::int32_t>{tok}, positions(12 + t, 1), std::vector<std::int64_t>{0}, false, true);
    INFO("decode step " << t);
    CHECK(nmse(g, w) < 1e-6);
    for (int layer : {0, s.n_layers - 1})
      for (int h : {0, s.n_q_heads - 1})
        CHECK(nmse(ref.last_attention(layer, h), engine.last_attention(layer, h)) < 1e-6);
  }
  CHECK(ref.rows(0, 0) == 14);

  // Kept in fp16 on the device, the weights move the logits only slightly.
  TransformerRef half(s, DeviceWeights::F16);
  load_transformer_weights(gguf, s, half.sink());
  CHECK(nmse(half.forward(prompt, positions(0, 12), last, false, false), want) < 1e-3);
}

TEST_CASE("reference transformer matches the CPU engine on Gemma 3, sliding windows included", "[transformer_ref]") {
  if (!std::filesystem::exists(KVSIM_TEST_GEMMA))
    FAIL("Gemma 3 is missing: run scripts/setup.sh (" KVSIM_TEST_GEMMA ")");
  // Its first six layers (five local, the global one at the model's interval) with a window of 6
  // tokens, so a 12-token prompt in two chunks and the decode after it cross every local window.
  const std::string path = kvsim::test::patched_model(
      KVSIM_TEST_GEMMA, {{"gemma3.block_count", 6}, {"gemma3.attention.sliding_window", 6}}, "gemma3_window6.gguf");
  const GgufFile gguf(path);
  LlamaModel engine(gguf, WeightFormat::F32);
  const ModelConfig s = engine.config();
  REQUIRE(s.window(0) == 6);
  REQUIRE(s.window(5) == 0);
  REQUIRE(s.qk_norm);
  TransformerRef ref(s, DeviceWeights::F32);
  load_transformer_weights(gguf, s, ref.sink());

  const std::vector<std::int32_t> prompt = iota_tokens(12, 1000, 977, s.vocab);
  std::vector<float> q_engine, k_engine, q_ref, k_ref;
  const auto want =
      engine.forward(prompt, positions(0, 12), std::vector<std::int64_t>{11}, [&](const LayerActivations& a) {
        q_engine.insert(q_engine.end(), a.q.begin(), a.q.end());
        k_engine.insert(k_engine.end(), a.k.begin(), a.k.end());
      });
  const std::span<const std::int32_t> all(prompt);
  const auto pos = positions(0, 12);
  ref.forward(all.first(5), std::span(pos).first(5), {}, true, false);
  const auto got = ref.forward(all.subspan(5), std::span(pos).subspan(5), std::vector<std::int64_t>{6}, true, false,
                               [&](const LayerRows& r) {
                                 q_ref.insert(q_ref.end(), r.q, r.q + r.n * s.q_dim());
                                 k_ref.insert(k_ref.end(), r.k, r.k + r.n * s.kv_dim());
                               });
  // The engine's rows of the second chunk, layer by layer, against the reference's.
  std::vector<float> q_tail, k_tail;
  for (int l = 0; l < s.n_layers; ++l) {
    const auto q0 = q_engine.begin() + static_cast<std::ptrdiff_t>((l * 12 + 5) * s.q_dim());
    const auto k0 = k_engine.begin() + static_cast<std::ptrdiff_t>((l * 12 + 5) * s.kv_dim());
    q_tail.insert(q_tail.end(), q0, q0 + 7 * s.q_dim());
    k_tail.insert(k_tail.end(), k0, k0 + 7 * s.kv_dim());
  }
  CHECK(nmse(q_ref, q_tail) < 1e-6);
  CHECK(nmse(k_ref, k_tail) < 1e-6);
  CHECK(nmse(got, want) < 1e-6);

  engine.record_last_attention(true);
  for (std::int32_t t = 0; t < 3; ++t) {
    const std::int32_t tok = 4242 + 17 * t;
    const auto w = engine.forward(std::vector<std::int32_t>{tok}, positions(12 + t, 1), std::vector<std::int64_t>{0});
    const auto g =
        ref.forward(std::vector<std::int32_t>{tok}, positions(12 + t, 1), std::vector<std::int64_t>{0}, false, true);
    INFO("decode step " << t);
    CHECK(nmse(g, w) < 1e-6);
    // Gemma's q and k are unit-RMS per head (q/k norms) over 256 dims: logits of tens, softmax
    // weights peaked enough that the engine's float sums move them by up to ~1e-5 NMSE.
    for (int layer : {0, 5})
      for (int h : {0, s.n_q_heads - 1}) {
        INFO("layer " << layer << " head " << h);
        CHECK(nmse(ref.last_attention(layer, h), engine.last_attention(layer, h)) < 1e-4);
      }
    // A local layer's weights: nothing before its last 6 rows, a distribution over those.
    const auto w0 = ref.last_attention(0, 0);
    REQUIRE(w0.size() == static_cast<std::size_t>(13 + t));
    CHECK(std::all_of(w0.begin(), w0.end() - 6, [](float x) { return x == 0.0f; }));
    CHECK(std::accumulate(w0.end() - 6, w0.end(), 0.0) == Approx(1.0).epsilon(1e-5));
    CHECK(std::count(ref.last_attention(5, 0).begin(), ref.last_attention(5, 0).end(), 0.0f) == 0);
  }
}

TEST_CASE("reference transformer: chunked prefill and decode equal one pass", "[transformer_ref]") {
  for (const bool bias : {false, true}) {
    const ModelConfig s = tiny_shape(bias ? RopeType::Neox : RopeType::Norm, bias);
    TransformerRef one(s, DeviceWeights::F16), chunked(s, DeviceWeights::F16);
    random_weights(s, 7, one.sink());
    random_weights(s, 7, chunked.sink());
    const auto tokens = iota_tokens(10, 3, 7, s.vocab);
    const auto all = one.forward(tokens, positions(0, 10), std::vector<std::int64_t>{9}, false, false);
    chunked.forward(std::span(tokens).first(6), positions(0, 6), {}, false, false);
    chunked.forward(std::span(tokens).subspan(6, 3), positions(6, 3), {}, false, false);
    const auto last =
        chunked.forward(std::span(tokens).subspan(9, 1), positions(9, 1), std::vector<std::int64_t>{0}, false, false);
    INFO("bias " << bias);
    CHECK(nmse(last, all) < 1e-10);
    for (int e = 0; e < s.n_kv_heads; ++e) {
      REQUIRE(chunked.rows(2, e) == 10);
      CHECK(nmse(chunked.entry_k(2, e), one.entry_k(2, e)) == 0.0);
    }
    // The logits are not degenerate: random weights give a spread distribution.
    const auto [lo, hi] = std::minmax_element(all.begin(), all.end());
    CHECK(*hi - *lo > 1.0f);
  }
}

TEST_CASE("reference transformer: per-query-head entries read the same rows", "[transformer_ref]") {
  const ModelConfig s = tiny_shape(RopeType::Norm, false);
  TransformerRef kv(s, DeviceWeights::F32), pq(s, DeviceWeights::F32);
  random_weights(s, 11, kv.sink());
  random_weights(s, 11, pq.sink());
  const auto tokens = iota_tokens(8, 5, 13, s.vocab);
  kv.forward(tokens, positions(0, 8), {}, false, false);
  // The same cache, copied to one entry per query head (what a per-query-head plan leaves).
  for (int l = 0; l < s.n_layers; ++l) {
    std::vector<HostEntry> entries;
    for (int h = 0; h < s.n_q_heads; ++h) {
      const int e = h / s.group();
      entries.push_back({kv.rows(l, e), kv.entry_k(l, e).data(), kv.entry_v(l, e).data()});
    }
    pq.load_layer(l, entries);
    REQUIRE(pq.entries(l) == s.n_q_heads);
  }
  const std::vector<std::int32_t> next{42};
  const auto a = kv.forward(next, positions(8, 1), std::vector<std::int64_t>{0}, false, true);
  const auto b = pq.forward(next, positions(8, 1), std::vector<std::int64_t>{0}, false, true);
  CHECK(nmse(b, a) == 0.0);
  CHECK(nmse(pq.last_attention(1, 5), kv.last_attention(1, 5)) == 0.0);
  CHECK(pq.rows(0, 5) == 9);
}

TEST_CASE("reference transformer: a packed prefix is held as its stored form reads back", "[transformer_ref]") {
  const ModelConfig s = tiny_shape(RopeType::Neox, false);
  TransformerRef ref(s, DeviceWeights::F32);
  random_weights(s, 5, ref.sink());
  ref.forward(iota_tokens(8, 3, 7, s.vocab), positions(0, 8), {}, false, false);
  // Layer 1, entry 0: its first 5 rows stored as fp16 rows of other values (twice the cache's).
  std::vector<HostEntry> entries;
  std::vector<std::vector<float>> k(2), v(2);
  for (int e = 0; e < 2; ++e) {
    const auto ke = ref.entry_k(1, e), ve = ref.entry_v(1, e);
    k[static_cast<std::size_t>(e)].assign(ke.begin(), ke.end());
    v[static_cast<std::size_t>(e)].assign(ve.begin(), ve.end());
    entries.push_back({ref.rows(1, e), k[static_cast<std::size_t>(e)].data(), v[static_cast<std::size_t>(e)].data()});
  }
  PackedEntry p;
  p.head_dim = s.head_dim;
  for (int r = 0; r < 5; ++r) {
    std::vector<float> kr(k[0].begin() + r * s.head_dim, k[0].begin() + (r + 1) * s.head_dim), vr = kr;
    for (float& x : kr) x *= 2;
    for (float& x : vr) x = -x;
    pack_fp16_row(p.k, kr.data(), s.head_dim, r);
    pack_fp16_row(p.v, vr.data(), s.head_dim, r);
  }
  entries[0].packed = &p;
  ref.load_layer(1, entries);
  const std::vector<float> held(ref.entry_k(1, 0).begin(), ref.entry_k(1, 0).end());
  REQUIRE(held.size() == k[0].size());
  for (std::size_t i = 0; i < held.size(); ++i) {
    INFO("value " << i);
    CHECK(held[i] == (i < 5u * static_cast<std::size_t>(s.head_dim) ? 2 * k[0][i] : k[0][i]));
  }
  CHECK(ref.entry_v(1, 0)[3] == -ref.entry_k(1, 0)[3] / 2);
  // More packed rows than the entry has, or another head_dim: refused, naming the entry.
  entries[0].rows = 4;
  CHECK_THROWS_WITH(ref.load_layer(1, entries), Catch::Contains("entry 0's packed rows: 5 rows, but the entry has 4"));
  CHECK(std::vector<float>(ref.entry_k(1, 0).begin(), ref.entry_k(1, 0).end()) ==
        held);  // a refused load changes nothing
  entries[0].rows = ref.rows(1, 0);
  p.head_dim = 16;
  CHECK_THROWS_WITH(ref.load_layer(1, entries), Catch::Contains("head_dim"));
}

TEST_CASE("reference transformer: random packed caches (the parity harness's) load and run", "[transformer_ref]") {
  const ModelConfig s = tiny_shape(RopeType::Norm, false);
  TransformerRef ref(s, DeviceWeights::F32);
  random_weights(s, 9, ref.sink());
  ref.forward(iota_tokens(12, 1, 5, s.vocab), positions(0, 12), {}, false, false);
  std::mt19937 rng(3);
  const auto d = static_cast<std::size_t>(s.head_dim);
  for (int l = 0; l < s.n_layers; ++l) {
    INFO("layer " << l);
    const std::vector<float> before(ref.entry_k(l, 1).begin(), ref.entry_k(l, 1).end());
    const PackedLayer layer = random_packed_layer(
        s, l, 12,
        [&](int e, bool keys) {
          const auto x = keys ? ref.entry_k(l, e) : ref.entry_v(l, e);
          return std::vector<float>(x.begin(), x.end());
        },
        rng);
    for (std::size_t e = 0; e < layer.packs.size(); ++e)
      if (layer.is_packed[e]) REQUIRE_NOTHROW(check_packed(layer.packs[e]));
    if (l % 2 == 1) {  // every row packed: nothing left in fp16
      CHECK(layer.packs[0].rows() == 12);
      CHECK(layer.packs[1].rows() == 12);
      // KIVI-style keys: quantized rows 1 and 4 read one shared run of pairs, row 7 its own.
      const auto& rows = layer.packs[0].k.rows;
      CHECK(rows[1].kind == PackedKind::Quant);
      CHECK(rows[1].param == rows[4].param);
      CHECK(rows[7].param != rows[4].param);
    } else {  // entry 0: all but its last 3 rows; the last entry: none
      CHECK(layer.packs[0].rows() == 9);
      CHECK_FALSE(layer.is_packed[1]);
    }
    CHECK(std::isnan(layer.k[0][0]));  // packed rows carry no floats a backend could read instead
    ref.load_layer(l, layer.entries());
    std::vector<float> k0;
    unpack_tensor(layer.packs[0].k, s.head_dim, s.rope, k0);
    const auto held = ref.entry_k(l, 0);
    CHECK(std::vector<float>(held.begin(), held.begin() + static_cast<std::ptrdiff_t>(k0.size())) == k0);
    if (l % 2 == 0) {
      CHECK(std::vector<float>(ref.entry_k(l, 1).begin(), ref.entry_k(l, 1).end()) == before);  // unpacked entry
      CHECK(layer.k[0].size() == 12 * d);
    }
  }
  const std::vector<std::int32_t> next{7};
  const auto logits = ref.forward(next, positions(12, 1), std::vector<std::int64_t>{0}, false, false);
  for (float x : logits) REQUIRE(std::isfinite(x));
  CHECK(ref.rows(2, 0) == 13);
  CHECK(ref.rows(1, 1) == 13);
  // Entry rows that do not match the layer are refused, naming the entry.
  CHECK_THROWS_WITH(random_packed_layer(
                        s, 0, 11,
                        [&](int e, bool keys) {
                          const auto x = keys ? ref.entry_k(0, e) : ref.entry_v(0, e);
                          return std::vector<float>(x.begin(), x.end());
                        },
                        rng),
                    Catch::Contains("entry 0 has 13 rows, expected 11"));
}

TEST_CASE("reference transformer: random weights are deterministic per tensor", "[transformer_ref]") {
  const ModelConfig s = tiny_shape(RopeType::Norm, true);
  std::vector<float> first, again, other;
  auto grab = [](std::vector<float>& dst) {
    return [&dst](WeightId id, int layer, std::span<const float> d) {
      if (id == WeightId::Wk && layer == 1) dst.assign(d.begin(), d.end());
    };
  };
  random_weights(s, 3, grab(first));
  random_weights(s, 3, grab(again));
  random_weights(s, 4, grab(other));
  CHECK(first == again);
  CHECK(first != other);
  REQUIRE(first.size() == static_cast<std::size_t>(s.kv_dim() * s.n_embd));
  double ss = 0;
  for (float x : first) ss += static_cast<double>(x) * x;
  CHECK(ss / static_cast<double>(first.size()) == Approx(1.0 / s.n_embd).epsilon(0.15));  // N(0, 1/cols)
}

TEST_CASE("reference transformer: bad input names what is wrong", "[transformer_ref]") {
  ModelConfig s = tiny_shape(RopeType::Norm, false);
  TransformerRef ref(s, DeviceWeights::F32);
  std::vector<float> too_short(10);
  CHECK_THROWS_WITH(ref.set_weight(WeightId::Wq, 0, too_short),
                    Catch::Contains("attn_q") && Catch::Contains("expected 2304"));
  CHECK_THROWS_WITH(ref.set_weight(WeightId::TokenEmbd, 0, too_short), Catch::Contains("token_embd at layer 0"));
  const std::vector<std::int32_t> tok{1};
  CHECK_THROWS_WITH(ref.forward(tok, positions(0, 1), {}, false, false), Catch::Contains("not set"));
  random_weights(s, 1, ref.sink());
  const std::vector<std::int32_t> bad{static_cast<std::int32_t>(s.vocab)};
  CHECK_THROWS_WITH(ref.forward(bad, positions(0, 1), {}, false, false), Catch::Contains("token id 101 out of range"));
  CHECK_THROWS_WITH(ref.load_layer(0, std::vector<HostEntry>(3)), Catch::Contains("expected n_head_kv or n_head"));
  s.n_kv_heads = 4;  // 6 heads do not split into 4 groups
  CHECK_THROWS_WITH(TransformerRef(s, DeviceWeights::F32), Catch::Contains("multiple of n_kv_heads"));
}

TEST_CASE("transformer weights from GGUF: a shape the file does not have is refused", "[transformer_ref]") {
  if (!std::filesystem::exists(KVSIM_TEST_MODEL))
    FAIL("SmolLM2 is missing: run scripts/setup.sh (" KVSIM_TEST_MODEL ")");
  const GgufFile gguf(KVSIM_TEST_MODEL);
  ModelConfig s = model_config(gguf);
  s.n_ff += 1;
  try {
    load_transformer_weights(gguf, s, [](WeightId, int, std::span<const float>) {});
    FAIL("no error");
  } catch (const FormatError& e) {
    const std::string msg = e.what();
    CHECK_THAT(msg, Catch::Contains("blk.0.ffn_gate.weight") && Catch::Contains("expected [576, 1537]"));
  }
}

TEST_CASE("reference transformer runs every small geometry of the parity harness", "[transformer_ref]") {
  CHECK_NOTHROW(smollm2_shape().check());
  CHECK_NOTHROW(mistral7b_shape(2).check());
  auto shapes = kernel_corner_shapes();
  shapes.emplace_back("qwen2-like", qwen_like_shape());
  for (const auto& [label, s] : shapes) {
    INFO(label);
    TransformerRef f32(s, DeviceWeights::F32), f16(s, DeviceWeights::F16);
    random_weights(s, 7, [&](WeightId id, int layer, std::span<const float> d) {
      f32.set_weight(id, layer, d);
      f16.set_weight(id, layer, d);
    });
    const auto tokens = iota_tokens(40, 3, 7, s.vocab);
    const auto pos = positions(0, 40);
    const std::vector<std::int64_t> last = {39};
    const auto a = f32.forward(tokens, pos, last, false, false), b = f16.forward(tokens, pos, last, false, false);
    for (float x : a) REQUIRE(std::isfinite(x));
    // Random weights keep the activations O(1): fp16 rounding stays a small perturbation, so the
    // GPU's fp16 parity threshold (1e-4 against this reference in fp16) is meaningful.
    CHECK(nmse(b, a) < 1e-3);
    double norm = 0;
    for (float x : a) norm += static_cast<double>(x) * x;
    CHECK(norm / static_cast<double>(a.size()) > 1e-3);
  }
}

TEST_CASE("reference transformer: decode rules step over the last pass's weights only", "[transformer_ref]") {
  const ModelConfig s = qwen_like_shape();
  TransformerRef ref(s, DeviceWeights::F32);
  random_weights(s, 7, ref.sink());
  const auto tokens = iota_tokens(20, 3, 7, s.vocab);
  ref.forward(tokens, positions(0, 20), {}, false, false);
  const DecodeRuleStart tova{DecodeRule{false, true, HeadCombine::Sum, 1}, {}};
  for (int l = 0; l < s.n_layers; ++l) ref.start_rule(l, tova);
  CHECK_THROWS_AS(ref.rule_step(16), std::logic_error);  // no decode pass yet
  const std::vector<std::int32_t> one = {tokens[2]}, at = {20};
  const std::vector<std::int64_t> row0 = {0};
  // The weights stay with the backend unless asked for; the rule reads them all the same.
  ref.set_last_on_host(false);
  ref.forward(one, at, row0, false, true);
  CHECK_THROWS_AS(ref.last_attention(0, 0), std::logic_error);
  const auto gone = ref.rule_step(16);  // 21 rows, budget 16: five go from every entry, the same five
  for (int l = 0; l < s.n_layers; ++l) {
    REQUIRE(gone[static_cast<std::size_t>(l)].size() == static_cast<std::size_t>(ref.entries(l)));
    for (int e = 0; e < ref.entries(l); ++e) {
      CHECK(gone[static_cast<std::size_t>(l)][static_cast<std::size_t>(e)] == gone[static_cast<std::size_t>(l)][0]);
      CHECK(gone[static_cast<std::size_t>(l)][0].size() == 5);
      CHECK(ref.rows(l, e) == 16);
    }
  }
  CHECK_THROWS_AS(ref.rule_step(16), std::logic_error);  // once per pass
  CHECK_THROWS_WITH(ref.keep_rows(0, 0, std::vector<std::int64_t>{0}), Catch::Contains("evicts by its decode rule"));
  // A pass, then a reload and a new rule: the pass's weights are not over the reloaded rows.
  ref.set_last_on_host(true);
  ref.forward(std::vector<std::int32_t>{tokens[3]}, std::vector<std::int32_t>{21}, row0, false, true);
  CHECK(ref.last_attention(0, 0).size() == 17);
  std::vector<std::vector<float>> k, v;
  std::vector<HostEntry> entries;
  for (int e = 0; e < ref.entries(0); ++e) {
    k.emplace_back(ref.entry_k(0, e).begin(), ref.entry_k(0, e).begin() + 8 * s.head_dim);
    v.emplace_back(ref.entry_v(0, e).begin(), ref.entry_v(0, e).begin() + 8 * s.head_dim);
  }
  for (int e = 0; e < ref.entries(0); ++e)
    entries.push_back({8, k[static_cast<std::size_t>(e)].data(), v[static_cast<std::size_t>(e)].data()});
  ref.load_layer(0, entries);
  ref.start_rule(0, tova);
  CHECK_THROWS_AS(ref.rule_step(16), std::logic_error);
  // A packed layer refuses rules, as the GPU does (a rule compacts fp16 rows).
  std::mt19937 rng(5);
  const PackedLayer packed = random_packed_layer(
      s, 1, 20, [&](int, bool) { return gaussian(static_cast<std::size_t>(20 * s.head_dim), rng); }, rng);
  ref.load_layer(1, packed.entries());
  CHECK_THROWS_WITH(ref.start_rule(1, tova), Catch::Contains("holds packed entries"));
}
