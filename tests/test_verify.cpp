// Live verify on SmolLM2 (scripts/setup.sh fetches it): the policy code path is shared with the
// offline replay, so at the compression point live and offline choose the same keep-sets and
// count the same bytes; budget 1.0 changes nothing; every policy the simulator has runs live.
#include <catch2/catch.hpp>
#include <numeric>

#include <algorithm>
#include <filesystem>
#include <iterator>
#include <set>

#include "model/backend_engine.h"
#include "capture/capture_driver.h"
#include "prompts/prompt.h"
#include "model/tokenizer.h"
#include "model/gguf.h"
#include "model/llama_model.h"
#include "model/transformer_weights.h"
#include "policies/registry.h"
#include "kvcache/cache_signals.h"
#include "sim/replay.h"
#include "traces/trace_reader.h"
#include "counting_backend.h"
#include "gguf_fixtures.h"
#include "learned_fixtures.h"
#include "trace_fixtures.h"
#include "verify/live_verifier.h"

using namespace kvsim;

namespace {

CaptureRequest needle_request() {
  CaptureRequest r;
  r.id = "needle";
  r.line = 1;
  r.context =
      "The archive held many letters. Some were about the weather, others about the harvest and the "
      "price of grain. One letter said: the secret code of the vault is 4817. The rest spoke of travel, "
      "of roads washed out by rain, and of a bridge that was rebuilt twice in one summer.";
  r.question = "What is the secret code of the vault?";
  r.expected = "[\"4817\"]";
  return r;
}

// Every registered policy with its defaults, at `budgets` (full once).
// Learned policies get a seeded model file for `g` (the test model's geometry by default).
std::vector<ReplayConfig> all_configs(const std::vector<double>& budgets,
                                      const ModelGeometry& g = smollm2_135m_geometry()) {
  std::vector<ReplayConfig> out;
  for (const PolicyInfo* info : PolicyRegistry::instance().all()) {
    PolicyInstance inst = PolicyRegistry::instance().create(test::runnable_spec(info->name, g));
    std::shared_ptr<const Policy> impl(std::move(inst.policy));
    if (!impl->respects_budget()) {
      out.push_back({inst.name, inst.params, impl, 1.0});
      continue;
    }
    for (double b : budgets) out.push_back({inst.name, inst.params, impl, b});
  }
  return out;
}

ReplayConfig config_of(const std::string& spec, double budget) {
  PolicyInstance inst = PolicyRegistry::instance().create(spec);
  std::shared_ptr<const Policy> impl(std::move(inst.policy));
  return {inst.name, inst.params, impl, budget};
}

// A trace of `r` on `model` with every query and KVzip's reconstruction pass recorded.
std::string capture_trace(const std::string& model, const CaptureRequest& r, const std::string& name, int max_new) {
  CaptureOptions co;
  co.model_path = model;
  co.out_path = test::scratch_file(name);
  co.overwrite = true;
  co.all_queries = true;
  co.max_new = max_new;
  co.repeat_pass = true;
  run_capture({r}, co);
  return co.out_path;
}

// A backend engine's live results against the CPU engine's, config by config: the same keep-sets,
// bytes and top-1, KL up to fp16 rounding. The backend attends over a codec's packed form read
// back in fp16 where the CPU engine keeps the codec's float reconstruction (measured: relative
// differences of 2e-3 or less). A 4-bit codec is the exception: a value rounding the other way
// crosses a quantization level, and the CPU engine's own KL moves between machines and compilers
// (0.02328 here, 0.02294 on a CI machine, 0.02398 in a clang build on a third, with the backend's at
// 0.02324 on all), so quantized configs get 4e-2; a wrong bit width or group moves it by far more.
//
// Decode-time eviction (H2O at every step) ranks tokens by attention summed over the steps: the
// backend's in-engine rule sums the reference's double-precision weights, the CPU engine's host
// rule its float ones, so a near tie can go either way. On a clang build of this machine (Eigen
// blocks its GEMMs by the cache sizes the CPU reports) a few such ties flip: there each entry
// must keep as many tokens, all but 2 of them the same.
std::size_t kept_differences(const std::vector<std::vector<std::vector<std::int32_t>>>& a,
                             const std::vector<std::vector<std::vector<std::int32_t>>>& b) {
  if (a.size() != b.size()) return std::size_t(-1);
  std::size_t worst = 0;
  for (std::size_t l = 0; l < a.size(); ++l) {
    if (a[l].size() != b[l].size()) return std::size_t(-1);
    for (std::size_t e = 0; e < a[l].size(); ++e) {
      if (a[l][e].size() != b[l][e].size()) return std::size_t(-1);
      std::vector<std::int32_t> common;
      std::set_intersection(a[l][e].begin(), a[l][e].end(), b[l][e].begin(), b[l][e].end(), std::back_inserter(common));
      worst = std::max(worst, a[l][e].size() - common.size());
    }
  }
  return worst;
}

void check_same_live(const std::vector<ReplayConfig>& configs, const LiveRequestResult& got,
                     const LiveRequestResult& want) {
  CHECK(got.reference == want.reference);
  REQUIRE(got.configs.size() == configs.size());
  for (std::size_t i = 0; i < configs.size(); ++i) {
    INFO(configs[i].label());
    const LiveConfigResult &g = got.configs[i], &w = want.configs[i];
    if (configs[i].policy == "h2o")
      CHECK(kept_differences(g.kept, w.kept) <= 2);
    else
      CHECK(g.kept == w.kept);
    CHECK(g.compressed_bytes == Approx(w.compressed_bytes));
    CHECK(g.final_rows == w.final_rows);
    const bool quantized = configs[i].policy == "intn" || configs[i].policy == "qevict";
    CHECK(g.mean_kl == Approx(w.mean_kl).margin(1e-4).epsilon(quantized ? 4e-2 : 5e-3));
    CHECK(g.top1 == w.top1);
  }
}

void require_model() {
  if (!std::filesystem::exists(KVSIM_TEST_MODEL))
    FAIL("SmolLM2 is missing: run scripts/setup.sh (" KVSIM_TEST_MODEL ")");
}

}  // namespace

TEST_CASE("live verify at budget 1.0 is the full-cache run for every policy", "[verify]") {
  require_model();
  const GgufFile gguf(KVSIM_TEST_MODEL);
  for (const ReplayMode mode : {ReplayMode::QueryAware, ReplayMode::QueryAgnostic}) {
    VerifyOptions o;
    o.mode = mode;
    o.max_new = 6;
    LiveVerifier v(gguf, o);
    const auto configs = all_configs({1.0});
    const LiveRequestResult res = v.run(needle_request(), configs);
    REQUIRE(res.configs.size() == configs.size());
    CHECK(res.reference.size() >= 2);
    for (std::size_t i = 0; i < configs.size(); ++i) {
      INFO(configs[i].label() << " " << mode_name(mode));
      const LiveConfigResult& r = res.configs[i];
      CHECK(r.mean_kl == 0.0);
      CHECK(r.max_kl == 0.0);
      CHECK(r.top1 == 1.0);
      CHECK(r.same_tokens);
      CHECK(r.kept_fraction >= 1.0);
    }
  }
}

TEST_CASE("live and offline choose the same keep-sets and bytes at the compression point", "[verify]") {
  require_model();
  // kvzip's signal is recorded offline and run live.
  const TraceReader reader(capture_trace(KVSIM_TEST_MODEL, needle_request(), "verify_agree.h5", 6));
  const RequestHeader h = reader.header("needle");

  const GgufFile gguf(KVSIM_TEST_MODEL);
  for (const ReplayMode mode : {ReplayMode::QueryAware, ReplayMode::QueryAgnostic}) {
    VerifyOptions o;
    o.mode = mode;
    o.max_new = 6;
    LiveVerifier v(gguf, o);
    const auto configs = all_configs({0.3, 0.6});
    const LiveRequestResult live = v.run(needle_request(), configs);
    // The live reference continuation is the captured greedy one.
    CHECK(std::vector<std::int32_t>(h.tokens.begin() + h.n_prompt, h.tokens.end()) == live.reference);

    // Offline: the same configs replayed on the trace (bytes), and their plans on the trace's
    // signals at the same point (keep-sets).
    const RequestResult offline = Replayer(reader, mode, configs).replay("needle");
    const std::int64_t c = offline.compression_point;
    CHECK(c == live.compression_point);
    const ModelGeometry g = v.geometry();
    const int d = g.head_dim, Hkv = g.n_kv_heads;
    // Every layer's signals at the point first: configs that select across layers (kvzip's
    // level=model) make one selection from all of them, as both engines do.
    struct LayerInputs {
      kvcache::FloatBuffer k, val, q;
      kvcache::CacheView view;
      RepeatPassView repeat;
      std::vector<float> repeat_q, repeat_k;
      std::unique_ptr<kvcache::CacheSignals> signals;
    };
    std::vector<std::unique_ptr<LayerInputs>> layers;
    for (int layer = 0; layer < g.n_layers; ++layer) {
      auto& in = *layers.emplace_back(std::make_unique<LayerInputs>());
      in.k.resize(reader.layer_elements("needle", Tensor::K));
      in.val.resize(in.k.size());
      in.q.resize(reader.layer_elements("needle", Tensor::Q));
      reader.read_layer("needle", Tensor::K, layer, in.k);
      reader.read_layer("needle", Tensor::V, layer, in.val);
      reader.read_layer("needle", Tensor::Q, layer, in.q);
      const RepeatPass table = reader.repeat_pass_table("needle");
      for (const RepeatChunk& ch : table.chunks)
        in.repeat.chunks.push_back({ch.begin, ch.end, ch.row_begin, ch.row_end});
      in.repeat.rows = table.rows;
      reader.read_repeat_layer("needle", layer, in.repeat_q, in.repeat_k);
      in.repeat.q = in.repeat_q.data();
      in.repeat.k = in.repeat_k.data();
      in.view.repeat = &in.repeat;
      const auto T = static_cast<Eigen::Index>(h.n_tokens());
      for (int kv = 0; kv < Hkv; ++kv) {
        std::vector<std::int32_t> t(static_cast<std::size_t>(c));
        for (std::int64_t j = 0; j < c; ++j) t[static_cast<std::size_t>(j)] = static_cast<std::int32_t>(j);
        in.view.tokens.push_back(t);
        const kvcache::StridedMap kh(in.k.data() + kv * d, T, d, Eigen::OuterStride<>(Hkv * d));
        const kvcache::StridedMap vh(in.val.data() + kv * d, T, d, Eigen::OuterStride<>(Hkv * d));
        in.view.keys.push_back(kh.topRows(c));
        in.view.values.push_back(vh.topRows(c));
      }
      in.signals = std::make_unique<kvcache::CacheSignals>(
          "trace", g, layer, c, kvcache::RequestTokens{h.positions, h.segments, h.q_index}, in.q, in.view);
    }
    std::vector<Budget> budgets;
    std::size_t across = 0;
    for (std::size_t i = 0; i < configs.size(); ++i) {
      const ReplayConfig& cfg = configs[i];
      budgets.emplace_back(offline.configs[i].budget_tokens, cfg.budget);
      if (!cfg.impl->selects_across_layers() || cfg.budget >= 1.0) continue;
      std::vector<std::shared_ptr<const void>> summaries;
      for (const auto& in : layers) summaries.push_back(cfg.impl->layer_summary(*in->signals));
      budgets.back().across_layers = cfg.impl->select_across_layers(summaries, budgets.back());
      ++across;
    }
    CHECK(across > 0);
    std::size_t compared = 0;
    for (int layer = 0; layer < g.n_layers; ++layer) {
      const kvcache::CacheSignals& signals = *layers[static_cast<std::size_t>(layer)]->signals;
      for (std::size_t i = 0; i < configs.size(); ++i) {
        const ReplayConfig& cfg = configs[i];
        INFO(cfg.label() << " at " << cfg.budget << ", layer " << layer << ", " << mode_name(mode));
        if (cfg.impl->reads_future() || !cfg.impl->respects_budget()) continue;
        const LayerPlan plan = cfg.impl->compress(signals, budgets[i]);
        const auto& kept = live.configs[i].kept[static_cast<std::size_t>(layer)];
        REQUIRE(kept.size() == plan.heads.size());
        for (std::size_t e = 0; e < plan.heads.size(); ++e) {
          std::vector<std::int32_t> want;
          for (std::int64_t j = 0; j < c; ++j)
            if (plan.heads[e].codec[static_cast<std::size_t>(j)] != TokenCodec::Drop)
              want.push_back(static_cast<std::int32_t>(j));
          CHECK(kept[e] == want);
          ++compared;
        }
      }
    }
    CHECK(compared > 100);
    for (std::size_t i = 0; i < configs.size(); ++i) {
      INFO(configs[i].label() << " at " << configs[i].budget << ", " << mode_name(mode));
      CHECK(live.configs[i].budget_tokens == offline.configs[i].budget_tokens);
      CHECK(live.configs[i].compressed_bytes == Approx(offline.configs[i].compressed_bytes).epsilon(1e-12));
      CHECK(live.configs[i].compressed_bytes <= live.configs[i].budget_bytes + 1e-6);
      CHECK(live.configs[i].kept_fraction == Approx(offline.configs[i].kept_fraction).epsilon(1e-12));
    }
  }
}

TEST_CASE("live qevict re-tiers while decoding and holds its byte budget", "[verify]") {
  require_model();
  const GgufFile gguf(KVSIM_TEST_MODEL);
  std::vector<ReplayConfig> configs;
  for (const std::string spec : {"qevict:retier=2", "qevict:retier=0"}) configs.push_back(config_of(spec, 0.3));
  for (const ReplayMode mode : {ReplayMode::QueryAware, ReplayMode::QueryAgnostic}) {
    INFO(mode_name(mode));
    VerifyOptions o;
    o.mode = mode;
    o.max_new = 8;
    LiveVerifier v(gguf, o);
    // The engine throws if a re-tier leaves a head over its byte budget.
    const LiveRequestResult res = v.run(needle_request(), configs);
    const LiveConfigResult &retier = res.configs[0], &once = res.configs[1];
    CHECK(retier.compressed_bytes <= retier.budget_bytes);
    CHECK(retier.mean_kl > 0);
    // Never re-tiered, every decode token stays; re-tiered, the cache is cut back to the budget.
    CHECK(retier.final_rows < once.final_rows);
  }
}

TEST_CASE("live verify on the backend engine (the --device cuda path, over the CPU reference) matches the CPU engine",
          "[verify]") {
  require_model();
  const GgufFile gguf(KVSIM_TEST_MODEL);
  VerifyOptions o;
  o.max_new = 4;
  o.weights = WeightFormat::F32;
  // Eviction (one-shot and at every decode step), a quantized and a low-rank codec (their tokens
  // travel packed to the backend), and three tiers.
  std::vector<ReplayConfig> configs;
  for (const std::string spec : {"snapkv", "h2o", "intn:bits=4", "lowrank", "qevict"})
    configs.push_back(config_of(spec, spec == "lowrank" ? 0.5 : 0.25));
  LiveVerifier cpu(gguf, o);
  auto backend = std::make_unique<test::CountingBackend>(model_config(gguf), gpu::DeviceWeights::F32);
  const test::CountingBackend& counter = *backend;
  LiveVerifier on_backend(gguf, o, std::make_unique<BackendEngine>(gguf, std::move(backend)));
  const LiveRequestResult want = cpu.run(needle_request(), configs);
  const LiveRequestResult got = on_backend.run(needle_request(), configs);
  CHECK(counter.packed > 0);  // the codecs' tokens reached the backend in their stored form
  check_same_live(configs, got, want);
}

TEST_CASE("live verify of Gemma 3 on the backend engine matches the CPU engine, windows held", "[verify]") {
  if (!std::filesystem::exists(KVSIM_TEST_GEMMA))
    FAIL("Gemma 3 is missing: run scripts/setup.sh (" KVSIM_TEST_GEMMA ")");
  // Six layers (five local, one global) with a window of 16 tokens, shorter than the request.
  const GgufFile gguf(test::patched_model(KVSIM_TEST_GEMMA,
                                          {{"gemma3.block_count", 6}, {"gemma3.attention.sliding_window", 16}},
                                          "gemma3_window16_verify.gguf"));
  VerifyOptions o;
  o.max_new = 4;
  o.weights = WeightFormat::F32;
  std::vector<ReplayConfig> configs;  // budgets above the windows' share of the cache
  for (const std::string spec : {"snapkv", "h2o", "intn:bits=4", "lowrank", "qevict"})
    configs.push_back(config_of(spec, 0.75));
  LiveVerifier cpu(gguf, o);
  auto backend = std::make_unique<test::CountingBackend>(model_config(gguf), gpu::DeviceWeights::F32);
  const test::CountingBackend& counter = *backend;
  LiveVerifier on_backend(gguf, o, std::make_unique<BackendEngine>(gguf, std::move(backend)));
  const LiveRequestResult want = cpu.run(needle_request(), configs);
  const LiveRequestResult got = on_backend.run(needle_request(), configs);
  CHECK(counter.packed > 0);  // the global layer's codec rows reached the backend packed
  check_same_live(configs, got, want);
}

TEST_CASE("peak semantics on Gemma 3's sliding windows, live and offline: the same bytes at every step", "[verify]") {
  if (!std::filesystem::exists(KVSIM_TEST_GEMMA))
    FAIL("Gemma 3 is missing: run scripts/setup.sh (" KVSIM_TEST_GEMMA ")");
  // Six layers (five local, one global) with a window of 16 tokens, full at the compression point.
  const std::string model =
      test::patched_model(KVSIM_TEST_GEMMA, {{"gemma3.block_count", 6}, {"gemma3.attention.sliding_window", 16}},
                          "gemma3_window16_peak.gguf");
  const std::string trace = capture_trace(model, needle_request(), "gemma3_window16_peak.h5", 6);
  const TraceReader reader(trace);
  const GgufFile gguf(model);
  std::vector<ReplayConfig> configs;
  for (const std::string spec : {"snapkv", "h2o", "streamingllm"}) configs.push_back(config_of(spec, 0.8));
  const BudgetRule rule{true, 2};
  VerifyOptions o;
  o.max_new = 6;
  o.budget_rule = rule;
  LiveVerifier v(gguf, o);
  const LiveRequestResult live = v.run(needle_request(), configs);
  const RequestResult offline = Replayer(reader, ReplayMode::QueryAware, configs, 0, rule).replay("needle");
  for (std::size_t i = 0; i < configs.size(); ++i) {
    INFO(configs[i].label());
    const LiveConfigResult& x = live.configs[i];
    CHECK(x.decode_peak_bytes <= x.budget_bytes);
    CHECK(x.decode_peak_bytes > x.compressed_bytes);
    CHECK(x.compressed_bytes == Approx(offline.configs[i].compressed_bytes).epsilon(1e-12));
    CHECK(x.decode_peak_bytes == Approx(offline.configs[i].decode_peak_bytes).epsilon(1e-12));
  }
}

TEST_CASE("a minimum of new tokens: no end of generation before it, captured and live alike", "[verify]") {
  require_model();
  const GgufFile gguf(KVSIM_TEST_MODEL);
  Tokenizer tok(gguf);
  const std::vector<ReplayConfig> configs = {config_of("snapkv", 0.5)};
  CaptureRequest r = needle_request();  // a short answer, then the end of the turn
  r.context = "The archive held many letters. One letter said: the secret code of the vault is 4817.";
  r.question = "What is the secret code of the vault? Answer with the number only.";
  VerifyOptions o;
  o.max_new = 40;
  const LiveRequestResult plain = LiveVerifier(gguf, o).run(r, configs);
  REQUIRE(plain.reference.size() < 40);  // the model answers and ends: the minimum must matter
  CHECK(tok.is_eog(plain.reference.back()));
  o.min_new = 40;
  const LiveRequestResult longer = LiveVerifier(gguf, o).run(r, configs);
  REQUIRE(longer.reference.size() == 40);
  for (const std::int32_t t : longer.reference) CHECK_FALSE(tok.is_eog(t));
  // Until the model would have ended, the continuation is the plain one.
  CHECK(std::equal(plain.reference.begin(), plain.reference.end() - 1, longer.reference.begin()));
  CHECK(longer.configs[0].steps > plain.configs[0].steps);
  // Capture with the same minimum records the same continuation.
  CaptureOptions co;
  co.model_path = KVSIM_TEST_MODEL;
  co.out_path = test::scratch_file("min_new.h5");
  co.overwrite = true;
  co.max_new = 40;
  co.min_new = 40;
  run_capture({r}, co);
  const RequestHeader h = TraceReader(co.out_path).header("needle");
  CHECK(h.n_tokens() - h.n_prompt == 40);
  o.min_new = 41;
  CHECK_THROWS_WITH(LiveVerifier(gguf, o), Catch::Contains("--min-new is 41"));
}

TEST_CASE("decode-time rules stepped inside the backend engine evict what the host steps evict", "[verify]") {
  require_model();
  const GgufFile gguf(KVSIM_TEST_MODEL);
  VerifyOptions o;
  o.max_new = 8;
  o.weights = WeightFormat::F32;
  std::vector<ReplayConfig> configs;
  for (const std::string spec : {"h2o", "h2o:gqa=max,recent_ratio=0.25", "tova"})
    configs.push_back(config_of(spec, 0.2));
  const auto shape = model_config(gguf);
  auto run = [&](bool in_engine, int& rule_steps) {
    VerifyOptions oo = o;
    oo.rules_in_engine = in_engine;
    auto backend = std::make_unique<test::CountingBackend>(shape, gpu::DeviceWeights::F32);
    const test::CountingBackend& counter = *backend;
    LiveVerifier v(gguf, oo, std::make_unique<BackendEngine>(gguf, std::move(backend)));
    LiveRequestResult r = v.run(needle_request(), configs);
    rule_steps = counter.rule_steps;
    return r;
  };
  int engine_steps = 0, host_steps = 0;
  const LiveRequestResult in_engine = run(true, engine_steps), on_host = run(false, host_steps);
  CHECK(host_steps == 0);
  CHECK(engine_steps > 0);
  for (std::size_t i = 0; i < configs.size(); ++i) {
    INFO(configs[i].label());
    const LiveConfigResult &e = in_engine.configs[i], &h = on_host.configs[i];
    CHECK(e.policy_steps == "engine");
    CHECK(h.policy_steps == "host");
    CHECK(e.steps > 0);
    CHECK(e.final_kept == h.final_kept);  // the same tokens evicted at every step, in every layer
    CHECK(e.final_kept != e.kept);        // and some were
    CHECK(e.mean_kl == h.mean_kl);        // the same cache, so the same logits, bit for bit
    CHECK(e.generated == h.generated);
  }
}

// A prompt whose question starts between tokens 512 and 768 and which ends before 768, so cuts
// every 256 tokens fall at 256, 512 and the compression point in both modes, where capture's
// forward passes end too.
CaptureRequest long_request(const GgufFile& gguf) {
  const Tokenizer tok(gguf);
  CaptureRequest r = needle_request();
  r.id = "long";
  std::string context;
  for (int i = 0; build_prompt(tok, r, default_system_prompt(gguf)).question_start < 560; ++i) {
    context += "Ledger line " + std::to_string(i) + ": the mill at station " + std::to_string(i * 7 % 31) +
               " shipped " + std::to_string(100 + i * 13 % 97) + " sacks of grain. ";
    r.context = context + (i == 20 ? "The secret code of the vault is 4817. " : "");
  }
  return r;
}

TEST_CASE("compression every 256 tokens: live and offline keep the same tokens, every policy, both modes", "[verify]") {
  require_model();
  // One layer: later tokens' keys, values and queries do not depend on earlier cuts, so both sides
  // see the same inputs at every cut and the shared plan API must make the same cache of them.
  const std::string model = test::one_layer_model(KVSIM_TEST_MODEL, "llama", "smollm2_one_layer.gguf");
  const GgufFile gguf(model);
  const CaptureRequest request = long_request(gguf);
  const Prompt p = build_prompt(Tokenizer(gguf), request, default_system_prompt(gguf));
  REQUIRE(p.question_start > 512);
  REQUIRE(static_cast<std::int64_t>(p.tokens.size()) < 768);
  // kvzip's signal is recorded, yet refused at compression cuts.
  const TraceReader reader(capture_trace(model, request, "verify_every256.h5", 5));
  for (const ReplayMode mode : {ReplayMode::QueryAware, ReplayMode::QueryAgnostic}) {
    VerifyOptions o;
    o.mode = mode;
    o.max_new = 5;
    o.compress_every = 256;
    LiveVerifier v(gguf, o);
    // KVzip's signal (the whole context repeated) is not handed out at compression cuts: both
    // sides refuse it alike.
    std::vector<ReplayConfig> configs;
    for (const ReplayConfig& c : all_configs({0.15, 0.4}, model_config(gguf)))
      if (!c.impl->needs_repeat_pass()) configs.push_back(c);
    const ReplayConfig kvzip_layer = config_of("kvzip:level=layer", 0.15);
    CHECK_THROWS_WITH(v.run(request, {kvzip_layer}), Catch::Contains("not handed out at compression cuts"));
    CHECK_THROWS_WITH(Replayer(reader, mode, {kvzip_layer}, 256).replay("long"),
                      Catch::Contains("not handed out at compression cuts"));
    // A selection across layers needs every layer at once: it compresses once, and says so.
    const ReplayConfig across = config_of("kvzip_proxy", 0.15);
    REQUIRE(across.impl->selects_across_layers());
    CHECK_THROWS_WITH(v.run(request, {across}), Catch::Contains("selects across layers"));
    CHECK_THROWS_WITH(Replayer(reader, mode, {across}, 256).replay("long"), Catch::Contains("selects across layers"));
    for (ReplayConfig& c : configs)
      if (c.impl->selects_across_layers()) c = config_of(c.policy + ":level=layer", c.budget);
    const LiveRequestResult live = v.run(request, configs);
    Replayer replayer(reader, mode, configs, 256);
    replayer.record_keep_sets(true);
    const RequestResult offline = replayer.replay("long");
    REQUIRE(offline.compression_point == live.compression_point);
    REQUIRE(offline.compression_point > 512);
    std::size_t cut_twice = 0;
    for (std::size_t i = 0; i < configs.size(); ++i) {
      INFO(configs[i].label() << " at " << configs[i].budget << ", " << mode_name(mode));
      const LiveConfigResult& l = live.configs[i];
      const ConfigResult& r = offline.configs[i];
      CHECK(l.kept == r.kept);
      CHECK(l.budget_tokens == r.budget_tokens);
      CHECK(l.compressed_bytes == Approx(r.compressed_bytes).epsilon(1e-12));
      // The budget is under 256 tokens at 0.15 of a ~600-token prompt: the first cut already cuts.
      if (r.budget_tokens < 256 && configs[i].impl->respects_budget()) ++cut_twice;
    }
    CHECK(cut_twice > 10);
  }
}

TEST_CASE("peak-matched budgets live: held at every step, and at the bytes replay counts", "[verify]") {
  require_model();
  const std::string trace = capture_trace(KVSIM_TEST_MODEL, needle_request(), "verify_peak.h5", 8);
  const TraceReader reader(trace);
  const GgufFile gguf(KVSIM_TEST_MODEL);
  std::vector<ReplayConfig> configs;
  for (const std::string spec : {"snapkv", "h2o", "streamingllm:phase=prefill", "pyramidkv", "intn", "qevict:retier=2",
                                 "keydiff", "kivi", "lowrank"})
    for (double b : {0.3, 0.6}) configs.push_back(config_of(spec, b));
  const BudgetRule rule{true, 2};
  for (const ReplayMode mode : {ReplayMode::QueryAware, ReplayMode::QueryAgnostic}) {
    VerifyOptions o;
    o.mode = mode;
    o.max_new = 8;
    o.budget_rule = rule;
    LiveVerifier v(gguf, o);
    const LiveRequestResult live = v.run(needle_request(), configs);
    const RequestResult offline = Replayer(reader, mode, configs, 0, rule).replay("needle");
    for (std::size_t i = 0; i < configs.size(); ++i) {
      INFO(configs[i].label() << " at " << configs[i].budget << ", " << mode_name(mode));
      const LiveConfigResult& x = live.configs[i];
      // Per step: the KL of each affected step and the token whose query gave it, in order.
      REQUIRE(x.step_kl.size() == static_cast<std::size_t>(x.steps));
      REQUIRE(x.step_query.size() == x.step_kl.size());
      CHECK(std::accumulate(x.step_kl.begin(), x.step_kl.end(), 0.0) / static_cast<double>(x.steps) ==
            Approx(x.mean_kl));
      CHECK(x.step_query.back() == live.prompt_tokens + static_cast<std::int64_t>(live.reference.size()) - 2);
      CHECK(std::is_sorted(x.step_query.begin(), x.step_query.end()));
      CHECK(x.decode_peak_bytes <= x.budget_bytes);
      CHECK(x.decode_peak_bytes > x.compressed_bytes);  // tokens joined, up to the budget
      CHECK(x.compressed_bytes == Approx(offline.configs[i].compressed_bytes).epsilon(1e-12));
      // Token counts set the bytes of eviction policies: the same steps re-apply live and
      // offline. (A codec's join is counted as fp16 offline and as stored live: at most that.)
      if (!configs[i].impl->codec())
        CHECK(x.decode_peak_bytes == Approx(offline.configs[i].decode_peak_bytes).epsilon(1e-12));
      else
        CHECK(x.decode_peak_bytes <= offline.configs[i].decode_peak_bytes + 1e-6);
    }
  }
}

TEST_CASE("a soft-gated cache runs live on the CPU engine; replay and the backend refuse it", "[verify]") {
  require_model();
  const GgufFile gguf(KVSIM_TEST_MODEL);
  const ModelGeometry g = smollm2_135m_geometry();
  const std::string model = test::seeded_model_file("sigmoid_gate", g);
  const std::vector<ReplayConfig> configs = {config_of("sigmoid_gate:soft=1,model=" + model, 0.3),
                                             config_of("sigmoid_gate:model=" + model, 0.3)};
  VerifyOptions o;
  o.max_new = 4;
  LiveVerifier v(gguf, o);
  const LiveRequestResult res = v.run(needle_request(), configs);
  // Soft: every token held, attention reweighted (so the outputs move); hard: 30% held.
  CHECK(res.configs[0].kept_fraction == 1.0);
  CHECK(res.configs[0].mean_kl > 0);
  CHECK(res.configs[1].kept_fraction < 0.35);
  const TraceReader reader(capture_trace(KVSIM_TEST_MODEL, needle_request(), "verify_soft.h5", 4));
  CHECK_THROWS_WITH(Replayer(reader, ReplayMode::QueryAware, {configs[0]}).replay("needle"),
                    Catch::Contains("offline replay does not score"));
  // Cuts before the compression point would strip the biases: refused, not run ungated.
  CHECK_THROWS_WITH(Replayer(reader, ReplayMode::QueryAware, {configs[0]}, 32).replay("needle"),
                    Catch::Contains("made once, at the compression point"));
  LiveVerifier on_backend(gguf, o,
                          std::make_unique<BackendEngine>(gguf, std::make_unique<test::CountingBackend>(
                                                                    model_config(gguf), gpu::DeviceWeights::F32)));
  CHECK_THROWS_WITH(on_backend.run(needle_request(), {configs[0]}), Catch::Contains("CPU engine only"));
  CHECK_THROWS_WITH(config_of("sigmoid_gate:soft=2,model=" + model, 0.3), Catch::Contains("'soft' must be 0 or 1"));
}
