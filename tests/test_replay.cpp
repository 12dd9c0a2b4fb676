// Replay engine: metrics against a brute-force recomputation, properties every policy must
// satisfy, and golden keep-sets for every policy at three budgets.
#include <catch2/catch.hpp>
#include <numeric>

#include <algorithm>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "core/error.h"
#include "policies/registry.h"
#include "kvcache/budget.h"
#include "kvcache/cache_signals.h"
#include "policies/selection.h"
#include "sim/replay.h"
#include "learned_fixtures.h"
#include "trace_fixtures.h"

using namespace kvsim;

namespace {

SynthConfig replay_config() {
  SynthConfig cfg = test::small_synth_config(3);
  cfg.n_requests = 2;
  cfg.context_tokens = 120;
  cfg.needle_tokens = 6;
  cfg.question_tokens = 8;
  cfg.generated_tokens = 8;
  cfg.retrieval_head_fraction = 0.5;
  return cfg;
}

const std::string& replay_trace() {
  static const std::string path = test::write_small_trace("replay.h5", replay_config());
  return path;
}

std::vector<ReplayConfig> configs(const std::vector<std::string>& specs, const std::vector<double>& budgets) {
  std::vector<ReplayConfig> out;
  for (const auto& s : specs) {
    PolicyInstance inst = PolicyRegistry::instance().create(s);
    std::shared_ptr<const Policy> impl(std::move(inst.policy));
    for (double b : budgets) out.push_back({inst.name, inst.params, impl, b});
  }
  return out;
}

// Every registered policy, with parameters that fit the small trace's recorded queries.
std::vector<std::string> every_policy(const ModelGeometry& g) {
  std::vector<std::string> specs;
  for (const PolicyInfo* p : PolicyRegistry::instance().all()) specs.push_back(test::runnable_spec(p->name, g));
  return specs;
}

}  // namespace

TEST_CASE("replay metrics equal a brute-force recomputation", "[replay]") {
  // 40 decode steps: more than one 16-step block of the decode path, with in-block evictions.
  SynthConfig cfg = replay_config();
  cfg.generated_tokens = 40;
  static const std::string path = test::write_small_trace("replay_long.h5", cfg);
  const TraceReader reader(path);
  const ModelGeometry& g = reader.geometry();
  const double budget = GENERATE(0.1, 0.75);  // kept side and dropped side of the shortcut
  const std::string phase = GENERATE(as<std::string>{}, "prefill", "decode");
  INFO("budget " << budget << ", phase " << phase);
  const Replayer replayer(reader, ReplayMode::QueryAware, configs({"streamingllm:sinks=4,phase=" + phase}, {budget}));
  const RequestResult res = replayer.replay("r0");
  const ConfigResult& r = res.configs[0];

  const RequestHeader h = reader.header("r0");
  const std::int64_t c = h.n_prompt, T = h.n_tokens(), d = g.head_dim, G = g.group();
  const std::int64_t B = static_cast<std::int64_t>(std::floor(budget * static_cast<double>(c)));
  // Row t sees: prefill phase, the cut made at c plus everything after it; decode phase, the
  // sinks plus the B - 4 tokens before t (evicted back to budget after every step) plus t.
  std::int64_t t = 0;
  auto kept = [&](std::int64_t j) {
    if (phase == "prefill") return j >= c || j < 4 || j >= c - (B - 4);
    return j < 4 || j >= t - (B - 4);
  };
  double recall_sum = 0, err_sum = 0;
  std::int64_t rows = 0;
  for (int layer = 0; layer < g.n_layers; ++layer) {
    std::vector<float> k(reader.layer_elements("r0", Tensor::K)), v(k.size()),
        q(reader.layer_elements("r0", Tensor::Q));
    reader.read_layer("r0", Tensor::K, layer, k);
    reader.read_layer("r0", Tensor::V, layer, v);
    reader.read_layer("r0", Tensor::Q, layer, q);
    for (std::size_t qi = 0; qi < h.q_index.size(); ++qi) {
      t = h.q_index[qi];
      if (t < c) continue;
      for (std::int64_t qh = 0; qh < g.n_q_heads; ++qh) {
        const std::int64_t kv = qh / G;
        std::vector<double> a(static_cast<std::size_t>(t + 1));
        double mx = -1e300;
        for (std::int64_t j = 0; j <= t; ++j) {
          double dot = 0;
          for (std::int64_t x = 0; x < d; ++x)
            dot += static_cast<double>(q[(qi * g.n_q_heads + qh) * d + x]) * k[(j * g.n_kv_heads + kv) * d + x];
          a[static_cast<std::size_t>(j)] = dot / std::sqrt(static_cast<double>(d));
          mx = std::max(mx, a[static_cast<std::size_t>(j)]);
        }
        double z = 0, m = 0;
        for (auto& x : a) z += (x = std::exp(x - mx));
        std::vector<double> o(static_cast<std::size_t>(d), 0.0), ok(o.size(), 0.0);
        for (std::int64_t j = 0; j <= t; ++j) {
          const double p = a[static_cast<std::size_t>(j)] / z;
          if (kept(j)) m += p;
          for (std::int64_t x = 0; x < d; ++x) {
            const double vx = v[(j * g.n_kv_heads + kv) * d + x];
            o[static_cast<std::size_t>(x)] += p * vx;
            if (kept(j)) ok[static_cast<std::size_t>(x)] += p * vx;
          }
        }
        double num = 0, den = 0;
        for (std::int64_t x = 0; x < d; ++x) {
          const double diff = o[static_cast<std::size_t>(x)] - ok[static_cast<std::size_t>(x)] / m;
          num += diff * diff;
          den += o[static_cast<std::size_t>(x)] * o[static_cast<std::size_t>(x)];
        }
        recall_sum += m;
        err_sum += std::sqrt(num / den);
        ++rows;
      }
    }
  }
  CHECK(r.rows == rows);
  CHECK(r.mean_recall == Approx(recall_sum / static_cast<double>(rows)).epsilon(1e-4));
  CHECK(r.mean_err == Approx(err_sum / static_cast<double>(rows)).epsilon(1e-3));
  CHECK(r.kept_fraction == Approx(static_cast<double>(B) / static_cast<double>(c)));
  const double bytes_per_step = static_cast<double>(g.n_layers * g.n_kv_heads * 4 * d);
  CHECK(r.final_bytes == Approx(bytes_per_step * static_cast<double>(phase == "prefill" ? B + (T - c) : B)));
  CHECK(r.compressed_bytes == Approx(static_cast<double>(B * g.n_layers * g.n_kv_heads * 4 * d)));
  CHECK(res.eval_queries == T - c);
}

TEST_CASE("one pass over many configs equals replaying each alone", "[replay]") {
  const TraceReader reader(replay_trace());
  const auto all = configs({"snapkv", "h2o", "random:seed=4", "keydiff", "tova", "streamingllm",
                            "snapkv:gqa=per_query_head", "oracle_future:alloc=layer"},
                           {0.1, 0.5});
  const RequestResult together = Replayer(reader, ReplayMode::QueryAware, all).replay("r1");
  for (std::size_t p = 0; p < all.size(); ++p) {
    const RequestResult alone = Replayer(reader, ReplayMode::QueryAware, {all[p]}).replay("r1");
    INFO(all[p].label() << " @ " << all[p].budget);
    CHECK(alone.configs[0].keep_hash == together.configs[p].keep_hash);
    // Same keep-sets exactly; metrics equal up to float rounding (together, a config's output is
    // built from a neighbouring config's plus their difference, alone from the empty/full set).
    CHECK(alone.configs[0].mean_kl == Approx(together.configs[p].mean_kl).epsilon(1e-6));
    CHECK(alone.configs[0].mean_err == Approx(together.configs[p].mean_err).epsilon(1e-6));
    CHECK(alone.configs[0].compressed_bytes == together.configs[p].compressed_bytes);
  }
}

TEST_CASE("sliding-window layers: held at their window, the budget spent on the global layers", "[replay]") {
  // Layers 0 and 2 attend to their last 32 tokens (Gemma-style), 1 and 3 to everything. The same
  // data without windows, replayed at the global layers' share of the budget, must give the same
  // global keep-sets: the budget goes where the cache grows.
  SynthConfig cfg = replay_config();
  const std::string plain = test::write_small_trace("replay_nowindow.h5", cfg);
  cfg.geometry.sliding_window = {32, 0, 32, 0};
  const std::string windowed = test::write_small_trace("replay_window.h5", cfg);
  const TraceReader rw(windowed), rp(plain);
  const ModelGeometry& g = rw.geometry();
  const std::int64_t c = rw.header("r0").n_prompt;
  const double held = 2.0 * 32 + 2.0 * static_cast<double>(c), token_bytes = 2.0 * 2 * g.head_dim;  // K+V fp16
  for (const std::string policy : {"snapkv", "h2o", "streamingllm"})
    for (const double budget : {0.4, 0.7}) {
      INFO(policy << " @ " << budget);
      Replayer with(rw, ReplayMode::QueryAware, configs({policy}, {budget}));
      with.record_keep_sets(true);
      const ConfigResult r = with.replay("r0").configs[0];
      const ConfigResult full = Replayer(rw, ReplayMode::QueryAware, configs({"full"}, {1.0})).replay("r0").configs[0];
      const double global = (budget * held - 64.0) / (2.0 * static_cast<double>(c));
      Replayer without(rp, ReplayMode::QueryAware, configs({policy}, {global}));
      without.record_keep_sets(true);
      const ConfigResult ref = without.replay("r0").configs[0];
      for (const int l : {1, 3}) CHECK(r.kept[static_cast<std::size_t>(l)] == ref.kept[static_cast<std::size_t>(l)]);
      for (const int l : {0, 2}) {
        std::vector<std::int32_t> window;
        for (std::int64_t t = c - 32; t < c; ++t) window.push_back(static_cast<std::int32_t>(t));
        for (const auto& entry : r.kept[static_cast<std::size_t>(l)]) CHECK(entry == window);
        CHECK(r.layer_kl[static_cast<std::size_t>(l)] == 0);
        for (const double k : r.head_kl[static_cast<std::size_t>(l)]) CHECK(k == 0);
      }
      CHECK(r.layer_kl[1] > 0);
      // Bytes: the local layers' windows count as held; the budget is a share of that.
      CHECK(full.budget_bytes == Approx(held * g.n_kv_heads * token_bytes));
      CHECK(full.compressed_bytes == Approx(full.budget_bytes));
      CHECK(r.budget_bytes == Approx(budget * full.budget_bytes));
      CHECK(r.compressed_bytes <= r.budget_bytes + 1e-6);
      CHECK(r.compressed_bytes > r.budget_bytes - 2.0 * g.n_kv_heads * 2 * token_bytes);  // within rounding
    }
  // A budget below what the windows alone hold cannot be met.
  CHECK_THROWS_WITH(Replayer(rw, ReplayMode::QueryAware, configs({"snapkv"}, {0.15})).replay("r0"),
                    Catch::Contains("sliding-window layers alone hold"));
  // Peak semantics: the windows are full at the compression point, so they hold the same bytes at
  // every step and the global layers' share holds the whole cache to the budget.
  for (const std::string policy : {"snapkv", "h2o", "streamingllm"}) {
    INFO(policy << " under peak semantics");
    const ConfigResult r =
        Replayer(rw, ReplayMode::QueryAware, configs({policy}, {0.6}), 0, parse_budget_rule("peak", 4))
            .replay("r0")
            .configs[0];
    CHECK(r.decode_peak_bytes <= r.budget_bytes + 1e-6);
    CHECK(r.decode_peak_bytes > 0.9 * r.budget_bytes);
    CHECK(r.layer_kl[0] == 0);  // a local layer loses nothing
    CHECK(r.layer_kl[1] > 0);
  }
  // A window still filling at the compression point would grow past the budget: refused by name.
  cfg.geometry.sliding_window = {4096, 0, 4096, 0};
  const TraceReader wide(test::write_small_trace("replay_window_wide.h5", cfg));
  CHECK_NOTHROW(Replayer(wide, ReplayMode::QueryAware, configs({"snapkv"}, {0.6})).replay("r0"));
  CHECK_THROWS_WITH(
      Replayer(wide, ReplayMode::QueryAware, configs({"snapkv"}, {0.6}), 0, parse_budget_rule("peak", 8)).replay("r0"),
      Catch::Contains("need every sliding window full") && Catch::Contains("layer 0's window of 4096"));
}

TEST_CASE("per-head KL: one value per (layer, query head), averaging to the layer's", "[replay]") {
  const TraceReader reader(replay_trace());
  const ModelGeometry& g = reader.geometry();
  // An eviction path, a decode-time path and an encoded one.
  const auto all = configs({"snapkv", "h2o", "kivi:bits=2"}, {0.25});
  const RequestResult res = Replayer(reader, ReplayMode::QueryAware, all).replay("r1");
  for (const ConfigResult& r : res.configs) {
    REQUIRE(r.head_kl.size() == static_cast<std::size_t>(g.n_layers));
    bool differ = false;
    for (int l = 0; l < g.n_layers; ++l) {
      const auto& heads = r.head_kl[static_cast<std::size_t>(l)];
      REQUIRE(heads.size() == static_cast<std::size_t>(g.n_q_heads));
      double sum = 0;
      for (double k : heads) {
        sum += k;
        differ = differ || std::abs(k - heads[0]) > 1e-9;
      }
      CHECK(sum / g.n_q_heads == Approx(r.layer_kl[static_cast<std::size_t>(l)]).epsilon(1e-9));
    }
    CHECK(differ);  // heads do differ: the values are not one layer mean copied
  }
}

TEST_CASE("encoded configs in one pass equal each alone; identical plans share their scores", "[replay]") {
  const TraceReader reader(replay_trace());
  // intn:bits=4 keeps every token at 0.5 and 0.99 (one plan, scored once) and drops some at 0.1.
  const auto all = configs({"intn:bits=4", "kivi", "lowrank", "varrate", "snapkv"}, {0.1, 0.5, 0.99});
  const RequestResult together = Replayer(reader, ReplayMode::QueryAware, all).replay("r1");
  for (std::size_t p = 0; p < all.size(); ++p) {
    const RequestResult alone = Replayer(reader, ReplayMode::QueryAware, {all[p]}).replay("r1");
    INFO(all[p].label() << " @ " << all[p].budget);
    CHECK(alone.configs[0].keep_hash == together.configs[p].keep_hash);
    CHECK(alone.configs[0].compressed_bytes == together.configs[p].compressed_bytes);
    if (all[p].impl->codec()) {  // scored on its own reconstruction either way: the same numbers
      CHECK(alone.configs[0].mean_kl == together.configs[p].mean_kl);
      CHECK(alone.configs[0].mean_err == together.configs[p].mean_err);
      CHECK(alone.configs[0].p95_kl == together.configs[p].p95_kl);
    }
  }
  const ConfigResult &low = together.configs[0], &mid = together.configs[1], &high = together.configs[2];
  CHECK(mid.keep_hash == high.keep_hash);
  CHECK(mid.mean_kl == high.mean_kl);
  CHECK(low.kept_fraction < 1.0);
  CHECK(low.mean_kl > mid.mean_kl);
  // intN at 0.1 cannot hold every token (4 bits + scales > 0.1 x 16 bits): it keeps sinks and
  // recent tokens by position, and the result says so; where every token fits it does not.
  CHECK(low.position_fallback == 1.0);
  CHECK(mid.position_fallback == 0.0);
  CHECK(together.configs[12].position_fallback == 0.0);  // snapkv selects by its rule
}

TEST_CASE("replay properties hold for every policy", "[replay]") {
  const TraceReader reader(replay_trace());
  const ReplayMode mode = GENERATE(ReplayMode::QueryAware, ReplayMode::QueryAgnostic);
  const std::vector<double> budgets = {0.1, 0.25, 0.5, 0.75, 1.0};
  // Every policy with its defaults, plus the one-shot forms of the decode-time ones: the
  // future oracle bounds one-shot keep-sets of the same size (decode-time policies keep fewer
  // tokens at each step and are only checked for the general properties).
  auto specs = every_policy(reader.geometry());
  for (const char* p : {"h2o:phase=prefill", "tova:phase=prefill", "streamingllm:phase=prefill",
                        "snapkv:gqa=per_query_head", "adakv:base=snapkv/gqa=per_query_head"})
    specs.push_back(p);
  const auto cfgs = configs(specs, budgets);
  for (const std::string id : {"r0", "r1"}) {
    const RequestResult res = Replayer(reader, mode, cfgs).replay(id);
    // `policy` is a name, or name:phase=prefill for the one-shot form.
    auto result = [&](const std::string& policy, double budget) -> const ConfigResult& {
      const auto colon = policy.find(':');
      const std::string name = policy.substr(0, colon);
      const bool one_shot = colon != std::string::npos;
      for (std::size_t p = 0; p < cfgs.size(); ++p)
        if (cfgs[p].policy == name && cfgs[p].budget == budget &&
            (cfgs[p].params.find("phase=prefill") != std::string::npos) == one_shot)
          return res.configs[p];
      throw Error("no result for " + policy);
    };
    for (std::size_t p = 0; p < cfgs.size(); ++p) {
      const ConfigResult& r = res.configs[p];
      INFO(mode_name(mode) << " " << id << " " << cfgs[p].label() << " @ " << cfgs[p].budget);
      // Budget 1.0 fits the whole cache: exact, except per-query-head plans, whose G copies
      // need G times the bytes and so still compress.
      const bool copies = cfgs[p].params.find("per_query_head") != std::string::npos;
      if ((cfgs[p].budget == 1.0 && !copies) || cfgs[p].policy == "full") {
        CHECK(r.mean_kl == 0.0);
        CHECK(r.mean_err == 0.0);
        CHECK(r.mean_recall == 1.0);
      } else {
        CHECK(r.compressed_bytes <= r.budget_bytes);
        CHECK(r.mean_recall <= 1.0 + 1e-9);
        CHECK(r.mean_kl >= 0.0);
      }
    }
    for (double b : {0.1, 0.25, 0.5, 0.75}) {
      const double oracle = result("oracle_future", b).mean_recall;
      for (const std::string uniform : {"random", "streamingllm:phase=prefill", "snapkv", "h2o:phase=prefill",
                                        "tova:phase=prefill", "keydiff", "expected_attention", "oracle_golden"}) {
        INFO(mode_name(mode) << " " << id << " budget " << b << ": oracle_future vs " << uniform);
        CHECK(oracle >= result(uniform, b).mean_recall - 1e-6);
      }
    }
    for (auto [lo, hi] : {std::pair{0.1, 0.25}, std::pair{0.25, 0.5}, std::pair{0.5, 0.75}, std::pair{0.75, 1.0}}) {
      CHECK(result("oracle_future", lo).mean_recall <= result("oracle_future", hi).mean_recall + 1e-9);
      CHECK(result("oracle_future", lo).mean_kl >= result("oracle_future", hi).mean_kl - 1e-9);
    }
  }
}

TEST_CASE("query-agnostic compression hurts SnapKV on a needle task", "[replay]") {
  // Longer context, strong retrieval heads: in query-aware mode the question is in SnapKV's
  // window and votes for the needle; in query-agnostic mode the window never sees it.
  SynthConfig cfg = replay_config();
  cfg.context_tokens = 400;
  cfg.question_tokens = 16;
  cfg.n_requests = 1;
  const std::string path = test::write_small_trace("needle.h5", cfg);
  const TraceReader reader(path);
  const auto cfgs = configs({"snapkv"}, {0.1});
  const double aware = Replayer(reader, ReplayMode::QueryAware, cfgs).replay("r0").configs[0].mean_kl;
  const double agnostic = Replayer(reader, ReplayMode::QueryAgnostic, cfgs).replay("r0").configs[0].mean_kl;
  INFO("query-aware KL " << aware << ", query-agnostic KL " << agnostic);
  CHECK(agnostic > 1.5 * aware);
}

namespace {

// Keeps each head's newest tokens and records, at every point it is asked, the tokens seen and
// how many future query rows its signals offer.
class FutureProbe : public Policy {
 public:
  bool reads_future() const override { return true; }
  LayerPlan compress(const LayerSignals& s, const Budget& b) const override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      seen_.emplace_back(s.n_tokens(), s.future_attention(0).rows);
    }
    LayerPlan plan;
    for (int kv = 0; kv < s.geometry().n_kv_heads; ++kv) {
      const auto n = static_cast<std::int64_t>(s.cached(kv).size());
      std::vector<std::uint8_t> keep(static_cast<std::size_t>(n), 0);
      for (std::int64_t j = std::max<std::int64_t>(0, n - b.tokens); j < n; ++j) keep[static_cast<std::size_t>(j)] = 1;
      plan.heads.push_back(plan_from_mask(keep));
    }
    return plan;
  }
  mutable std::mutex mu_;
  mutable std::vector<std::pair<std::int64_t, std::int64_t>> seen_;
};

}  // namespace

TEST_CASE("an oracle re-applied at a decode step sees only the queries still to come", "[replay]") {
  const TraceReader reader(replay_trace());
  auto probe = std::make_shared<const FutureProbe>();
  const Replayer replayer(reader, ReplayMode::QueryAware, {ReplayConfig{"probe", "", probe, 0.5}}, 0,
                          BudgetRule{true, 2});
  const RequestResult res = replayer.replay("r0");
  bool decode_point = false;
  for (const auto& [n, rows] : probe->seen_) {
    INFO("at " << n << " tokens");
    const auto to_come =
        std::count_if(res.eval_positions.begin(), res.eval_positions.end(), [n = n](std::int64_t p) { return p >= n; });
    CHECK(rows == to_come);
    decode_point = decode_point || n > res.compression_point;
  }
  CHECK(decode_point);
}

TEST_CASE("per-step output errors: one per layer and evaluation row, their mean the layer's", "[replay]") {
  const TraceReader reader(replay_trace());
  const auto cfgs = configs({"snapkv", "h2o", "kivi", "full"}, {0.25});
  for (const BudgetRule rule : {BudgetRule{}, BudgetRule{true, 4}}) {
    INFO(rule.name());
    Replayer replayer(reader, ReplayMode::QueryAware, cfgs, 0, rule);
    CHECK(replayer.replay("r0").configs[0].step_out_sq.empty());  // only when asked for
    replayer.record_steps(true);
    const RequestResult res = replayer.replay("r0");
    REQUIRE(res.eval_positions.size() == static_cast<std::size_t>(res.eval_queries));
    CHECK(res.eval_positions.front() == res.compression_point);
    for (const ConfigResult& r : res.configs) {
      REQUIRE(r.step_out_sq.size() == r.layer_out_sq.size());
      for (std::size_t l = 0; l < r.step_out_sq.size(); ++l) {
        REQUIRE(r.step_out_sq[l].size() == static_cast<std::size_t>(res.eval_queries));
        const double sum = std::accumulate(r.step_out_sq[l].begin(), r.step_out_sq[l].end(), 0.0);
        CHECK(sum / static_cast<double>(res.eval_queries) == Approx(r.layer_out_sq[l]).margin(1e-12));
      }
    }
    // The full cache errs at no step; a compressed one at some.
    const auto& snap = res.configs[0].step_out_sq;
    CHECK(std::any_of(snap.begin(), snap.end(), [](const auto& l) { return l.back() > 0; }));
    for (const auto& l : res.configs[3].step_out_sq)
      for (double x : l) CHECK(x == 0);
  }
}

TEST_CASE("golden keep-sets: every policy x 3 budgets", "[replay][golden]") {
  const TraceReader reader(replay_trace());
  const auto cfgs = configs(every_policy(reader.geometry()), {0.1, 0.25, 0.5});
  std::ostringstream table;
  for (const auto mode : {ReplayMode::QueryAware, ReplayMode::QueryAgnostic}) {
    const RequestResult res = Replayer(reader, mode, cfgs).replay("r0");
    for (std::size_t p = 0; p < cfgs.size(); ++p)
      table << mode_name(mode) << " " << test::stable_label(cfgs[p].label()) << " " << cfgs[p].budget << " "
            << res.configs[p].keep_hash << " " << static_cast<std::int64_t>(res.configs[p].compressed_bytes) << "\n";
  }
  const std::string golden_path = std::string(KVSIM_TEST_SOURCE_DIR) + "/golden/replay_keepsets.txt";
  if (std::getenv("KVSIM_UPDATE_GOLDEN")) std::ofstream(golden_path) << table.str();
  std::ifstream in(golden_path);
  std::stringstream expected;
  expected << in.rdbuf();
  INFO("golden file " << golden_path << " (regenerate with KVSIM_UPDATE_GOLDEN=1 after an intended change);"
                      << " this run produced:\n"
                      << table.str());
  CHECK(expected.str() == table.str());
}

TEST_CASE("compress-every: same result when one cut holds the prompt, bounded peak otherwise", "[replay]") {
  const TraceReader reader(replay_trace());
  const auto cfgs =
      configs({"snapkv:window=8", "streamingllm:phase=prefill", "h2o", "keydiff", "random:seed=2"}, {0.25});
  const RequestResult plain = Replayer(reader, ReplayMode::QueryAware, cfgs).replay("r0");
  const RequestResult one_chunk = Replayer(reader, ReplayMode::QueryAware, cfgs, 100000).replay("r0");
  const RequestResult chunked = Replayer(reader, ReplayMode::QueryAware, cfgs, 16).replay("r0");
  const ModelGeometry& g = reader.geometry();
  // K/V in fp16 plus at most 4 bytes of policy state per token, over all layers and KV heads.
  const double token_bytes = (4.0 * g.head_dim + 4.0) * g.n_layers * g.n_kv_heads;
  for (std::size_t p = 0; p < cfgs.size(); ++p) {
    INFO(cfgs[p].label());
    CHECK(one_chunk.configs[p].keep_hash == plain.configs[p].keep_hash);
    CHECK(one_chunk.configs[p].peak_bytes == plain.configs[p].peak_bytes);
    const ConfigResult& r = chunked.configs[p];
    CHECK(r.compressed_bytes <= r.budget_bytes);
    // The cache never held more than the budget plus one chunk (policy state included).
    CHECK(r.peak_bytes <= static_cast<double>(r.budget_tokens + 16) * token_bytes);
    CHECK(r.peak_bytes < plain.configs[p].peak_bytes);
  }
  // Sinks + most recent is the same set however the prefill was chunked.
  CHECK(chunked.configs[1].keep_hash == plain.configs[1].keep_hash);
  CHECK(chunked.configs[1].mean_kl == Approx(plain.configs[1].mean_kl).epsilon(1e-6));  // float rounding only
  CHECK_THROWS_WITH(
      Replayer(reader, ReplayMode::QueryAware, configs({"snapkv:window=8,gqa=per_query_head"}, {0.25}), 16)
          .replay("r0"),
      Catch::Contains("not supported with chunked compression"));
}

TEST_CASE("every policy runs on caches thinned at every compression cut", "[replay]") {
  const TraceReader reader(replay_trace());
  const ReplayMode mode = GENERATE(ReplayMode::QueryAware, ReplayMode::QueryAgnostic);
  auto specs = every_policy(reader.geometry());
  // KVzip's reconstruction pass repeats the whole context: compression cuts get no signal, and
  // say so. By default kvzip and kvzip_proxy select over every layer at once (KVzip's one
  // threshold), which a cut taken layer by layer cannot: they compress once, and say so.
  std::erase(specs, std::string("kvzip"));
  CHECK_THROWS_WITH(Replayer(reader, mode, configs({"kvzip:level=layer"}, {0.1}), 24).replay("r1"),
                    Catch::Contains("not handed out at compression cuts"));
  CHECK_THROWS_WITH(Replayer(reader, mode, configs({"kvzip"}, {0.1}), 24).replay("r1"),
                    Catch::Contains("selects across layers"));
  std::replace(specs.begin(), specs.end(), std::string("kvzip_proxy"), std::string("kvzip_proxy:level=layer"));
  specs.push_back("snapkv:window=8");
  const auto cfgs = configs(specs, {0.1, 0.5});
  const RequestResult res = Replayer(reader, mode, cfgs, 24).replay("r1");
  for (std::size_t p = 0; p < cfgs.size(); ++p) {
    INFO(mode_name(mode) << " " << cfgs[p].label() << " @ " << cfgs[p].budget);
    const ConfigResult& r = res.configs[p];
    if (cfgs[p].policy == "full") continue;
    CHECK(r.compressed_bytes <= r.budget_bytes);
    CHECK(r.mean_recall > 0.0);
    CHECK(r.mean_recall <= 1.0 + 1e-9);
    CHECK(r.mean_kl >= 0.0);
  }
}

TEST_CASE("quantized configs: every token kept, error grows as bits shrink, bytes are the codec's", "[replay]") {
  const TraceReader reader(replay_trace());
  // 0.99 of the fp16 bytes holds every token at 8, 4 and 2 bits (and KIVI-2): nothing is dropped.
  const auto cfgs =
      configs({"intn:bits=8", "intn:bits=4", "intn:bits=2", "kivi:bits=2,residual=32", "kivi:bits=4"}, {0.99});
  for (const ReplayMode mode : {ReplayMode::QueryAware, ReplayMode::QueryAgnostic}) {
    const RequestResult res = Replayer(reader, mode, cfgs).replay(reader.request_ids().front());
    const auto& g = reader.geometry();
    const double fp16 = 2.0 * 2 * g.head_dim;  // K + V per token
    const double tokens = static_cast<double>(g.n_layers) * g.n_kv_heads * static_cast<double>(res.compression_point);
    for (std::size_t i = 0; i < cfgs.size(); ++i) {
      INFO(cfgs[i].label() << " " << mode_name(mode));
      const ConfigResult& r = res.configs[i];
      CHECK(r.kept_fraction == 1.0);
      CHECK(r.mean_recall == Approx(1.0).margin(1e-6));
      CHECK(r.compressed_bytes < 0.99 * tokens * fp16);
      CHECK(r.compressed_bytes <= r.budget_bytes);
    }
    // head_dim 16: int8 / int4 / int2 rows with one min-max group cost 16 + 4, 8 + 4, 4 + 4 bytes.
    CHECK(res.configs[0].compressed_bytes == Approx(tokens * 2 * 20));
    CHECK(res.configs[1].compressed_bytes == Approx(tokens * 2 * 12));
    CHECK(res.configs[2].compressed_bytes == Approx(tokens * 2 * 8));
    CHECK(res.configs[0].mean_kl < 1e-3);
    CHECK(res.configs[0].mean_kl < res.configs[1].mean_kl);
    CHECK(res.configs[1].mean_kl < res.configs[2].mean_kl);
    CHECK(res.configs[0].mean_err < res.configs[1].mean_err);
    CHECK(res.configs[1].mean_err < res.configs[2].mean_err);
    CHECK(res.configs[4].mean_err < res.configs[3].mean_err);  // KIVI-4 beats KIVI-2
  }
}

TEST_CASE("quantized configs over budget keep sinks and recent tokens and stay within it", "[replay]") {
  const TraceReader reader(replay_trace());
  const auto cfgs = configs({"intn:bits=4", "kivi"}, {0.1, 0.25});
  const RequestResult res = Replayer(reader, ReplayMode::QueryAware, cfgs).replay(reader.request_ids().front());
  for (std::size_t i = 0; i < cfgs.size(); ++i) {
    INFO(cfgs[i].label() << " at " << cfgs[i].budget);
    CHECK(res.configs[i].kept_fraction < 1.0);
    CHECK(res.configs[i].compressed_bytes <= res.configs[i].budget_bytes);
    CHECK(res.configs[i].compressed_bytes > 0.8 * res.configs[i].budget_bytes);  // the budget is used, not wasted
  }
}

namespace {

// intn's plan, then a re-tier after every decode step that changes nothing: each step becomes
// its own stretch of the re-tiering replay, which must score exactly as the one-shot plan.
class SameTiersEveryStep : public Policy {
 public:
  SameTiersEveryStep() : base_(PolicyRegistry::instance().create("intn:bits=4").policy) {}
  const KvCodec* codec() const override { return base_->codec(); }
  LayerPlan compress(const LayerSignals& s, const Budget& b) const override { return base_->compress(s, b); }
  std::unique_ptr<DecodeState> start_decode(const LayerSignals& s, const LayerPlan& initial,
                                            const Budget&) const override {
    class Same : public DecodeState {
     public:
      explicit Same(std::vector<std::map<std::int32_t, TokenCodec>> codes) : codes_(std::move(codes)) {}
      void step(const DecodeStep&, std::vector<std::vector<std::int32_t>>&) override {}
      bool retier(const DecodeStep& step, LayerPlan& plan) override {
        plan.heads.clear();
        for (std::size_t kv = 0; kv < step.cache.size(); ++kv) {
          HeadPlan& hp = plan.heads.emplace_back();
          for (auto t : step.cache[kv]) hp.codec.push_back(codes_[kv].count(t) ? codes_[kv][t] : TokenCodec::Fp16);
        }
        return true;
      }

     private:
      std::vector<std::map<std::int32_t, TokenCodec>> codes_;
    };
    std::vector<std::map<std::int32_t, TokenCodec>> codes(initial.heads.size());
    for (std::size_t kv = 0; kv < initial.heads.size(); ++kv) {
      const auto cached = s.cached(static_cast<int>(kv));
      for (std::size_t m = 0; m < cached.size(); ++m) codes[kv][cached[m]] = initial.heads[kv].codec[m];
    }
    return std::make_unique<Same>(std::move(codes));
  }

 private:
  std::unique_ptr<Policy> base_;
};

}  // namespace

TEST_CASE("re-tiering replay: unchanged tiers score as one shot; qevict re-tiers within budget", "[replay]") {
  SynthConfig cfg = replay_config();
  cfg.generated_tokens = 40;
  static const std::string path = test::write_small_trace("replay_retier.h5", cfg);
  const TraceReader reader(path);
  const std::string id = reader.request_ids().front();
  // Budgets with room for the 40 decode tokens in fp16 (the re-tiers must hold the budget).
  auto cfgs = configs({"intn:bits=4"}, {0.8, 0.99});
  const std::shared_ptr<const Policy> same = std::make_shared<SameTiersEveryStep>();
  cfgs.push_back({"same_tiers", "", same, 0.8});
  cfgs.push_back({"same_tiers", "", same, 0.99});
  for (const ReplayMode mode : {ReplayMode::QueryAware, ReplayMode::QueryAgnostic}) {
    const RequestResult res = Replayer(reader, mode, cfgs).replay(id);
    for (std::size_t i = 0; i < 2; ++i) {
      INFO(mode_name(mode) << " budget " << cfgs[i].budget);
      const ConfigResult &one = res.configs[i], &walked = res.configs[i + 2];
      // fp32 GEMMs over other row counts round differently: agreement to ~1e-6 relative.
      CHECK(walked.mean_kl == Approx(one.mean_kl).epsilon(2e-5));
      CHECK(walked.mean_err == Approx(one.mean_err).epsilon(2e-5));
      CHECK(walked.mean_recall == Approx(one.mean_recall).epsilon(1e-7));
      CHECK(walked.p95_kl == Approx(one.p95_kl).epsilon(2e-5));
      CHECK(walked.compressed_bytes == Approx(one.compressed_bytes));
      CHECK(walked.final_bytes == Approx(one.final_bytes));
      CHECK(walked.peak_bytes == Approx(one.peak_bytes));
    }
  }
  // qevict re-tiering every 4 steps: back within the byte budget after each re-tier (the 40th
  // step re-tiers last), a host copy of its quantized tier, other metrics than never re-tiering.
  const auto q = configs({"qevict:retier=4", "qevict:retier=0"}, {0.3});
  const RequestResult res = Replayer(reader, ReplayMode::QueryAware, q).replay(id);
  const ConfigResult &retier = res.configs[0], &once = res.configs[1];
  CHECK(retier.compressed_bytes <= retier.budget_bytes);
  CHECK(retier.final_bytes <= retier.budget_bytes);
  CHECK(retier.peak_bytes > retier.final_bytes);  // between re-tiers new tokens join in fp16
  CHECK(retier.host_bytes > 0);
  CHECK(once.host_bytes > 0);
  CHECK(once.final_bytes > once.budget_bytes);  // never re-tiered: every decode token stays
  CHECK(retier.keep_hash != once.keep_hash);
  CHECK(retier.mean_kl != once.mean_kl);
}

TEST_CASE("a long prompt's observed attention is visited in row blocks, never n x n at once", "[replay]") {
  using kvcache::CacheSignals;
  using kvcache::CacheView;
  using kvcache::FloatBuffer;
  using kvcache::Mat;
  const std::int64_t n = 2100;  // n x n = 4.4M floats per head: past one 4M-float block
  const int d = 8;
  ModelGeometry g;
  g.n_layers = 1, g.n_q_heads = 2, g.n_kv_heads = 1, g.head_dim = d;
  RequestHeader h;
  h.id = "long";
  for (std::int64_t t = 0; t < n; ++t) {
    h.tokens.push_back(1);
    h.positions.push_back(static_cast<std::int32_t>(t));
    h.segments.push_back(1);
    h.q_index.push_back(static_cast<std::int32_t>(t));
  }
  h.n_prompt = n;
  h.question_start = n;
  std::srand(3);
  FloatBuffer q(static_cast<std::size_t>(n * g.n_q_heads * d));
  for (auto& x : q) x = static_cast<float>(std::rand() % 200 - 100) / 50.0f;
  CacheView view;
  view.tokens.emplace_back();
  for (std::int64_t t = 0; t < n; ++t) view.tokens[0].push_back(static_cast<std::int32_t>(t));
  view.keys.push_back(Mat::Random(n, d));
  view.values.push_back(Mat::Random(n, d));
  const CacheSignals s("test", g, 0, n, {h.positions, h.segments, h.q_index}, q, view);
  for (int qh = 0; qh < g.n_q_heads; ++qh) {
    const OwnedMatrix whole = s.observed_attention(qh);
    std::int64_t next = 0, blocks = 0;
    double worst = 0;
    s.visit_observed_attention(qh, [&](std::int64_t first, const MatrixView& b) {
      CHECK(first == next);  // consecutive, in order
      CHECK(b.rows * b.cols <= CacheSignals::kBlockFloats);
      REQUIRE(b.cols == n);
      for (std::int64_t i = 0; i < b.rows; ++i)
        for (std::int64_t j = 0; j < n; ++j)
          worst = std::max(worst, std::abs(static_cast<double>(b.at(i, j)) -
                                           whole.data[static_cast<std::size_t>((first + i) * n + j)]));
      next = first + b.rows;
      ++blocks;
    });
    CHECK(next == n);
    CHECK(blocks == 2);
    CHECK(worst < 1e-6);  // the same softmax rows (a smaller GEMM may sum in another order)
  }
  // H2O scores from the blocks: every token's accumulated attention, the prompt's n rows summed.
  const auto inst = PolicyRegistry::instance().create("h2o:phase=prefill");
  const LayerPlan plan = inst.policy->compress(s, Budget{n / 2, 0.5});
  CHECK(plan.heads[0].kept() == n / 2);
}

TEST_CASE("peak-matched budgets: no policy's cache exceeds its budget at any step", "[replay]") {
  const TraceReader reader(replay_trace());
  const ReplayMode mode = GENERATE(ReplayMode::QueryAware, ReplayMode::QueryAgnostic);
  auto specs = every_policy(reader.geometry());
  // Selections over every layer and the reconstruction pass cannot re-apply, and say so.
  std::erase(specs, std::string("kvzip"));
  std::erase(specs, std::string("qevict"));
  std::erase_if(specs, [](const std::string& s) { return s.rfind("rlkv:", 0) == 0; });  // one model-wide allocation
  std::replace(specs.begin(), specs.end(), std::string("kvzip_proxy"), std::string("kvzip_proxy:level=layer"));
  for (const char* s : {"snapkv:window=8", "qevict:retier=2", "h2o:phase=prefill", "tova:phase=prefill",
                        "lowrank:sinks=2", "adakv:alpha=0.5"})
    specs.push_back(s);
  const BudgetRule rule{true, 3};
  CHECK_THROWS_WITH(Replayer(reader, mode, configs({"kvzip"}, {0.25}), 0, rule).replay("r0"),
                    Catch::Contains("selects across layers"));
  CHECK_THROWS_WITH(
      Replayer(reader, mode, configs({test::runnable_spec("rlkv", reader.geometry())}, {0.25}), 0, rule).replay("r0"),
      Catch::Contains("divides its budget over the whole model"));
  const auto cfgs = configs(specs, {0.1, 0.25, 0.5});
  // The summary throws when a step exceeds the budget; the bytes are checked here as well.
  const RequestResult peak = Replayer(reader, mode, cfgs, 0, rule).replay("r0");
  const RequestResult point = Replayer(reader, mode, cfgs).replay("r0");
  int reapplied = 0, over_at_point = 0;
  for (std::size_t p = 0; p < cfgs.size(); ++p) {
    INFO(mode_name(mode) << " " << cfgs[p].label() << " @ " << cfgs[p].budget);
    if (cfgs[p].policy == "full") continue;
    const ConfigResult &r = peak.configs[p], &q = point.configs[p];
    CHECK(r.decode_peak_bytes <= r.budget_bytes);
    CHECK(r.compressed_bytes <= r.budget_bytes);
    CHECK(r.decode_peak_bytes >= r.compressed_bytes);
    CHECK(r.mean_recall > 0.0);
    CHECK(r.mean_kl >= 0.0);
    CHECK(r.budget_bytes == q.budget_bytes);
    over_at_point += q.decode_peak_bytes > q.budget_bytes;
    reapplied += r.keep_hash != q.keep_hash;
  }
  // Held at the compression point only, the caches outgrow their budgets as tokens join.
  CHECK(over_at_point > static_cast<int>(cfgs.size()) / 2);
  CHECK(reapplied > static_cast<int>(cfgs.size()) / 2);
}

TEST_CASE("peak-matched re-application: a one-shot rule applied again to the grown cache", "[replay]") {
  const TraceReader reader(replay_trace());
  const RequestHeader h = reader.header("r0");
  const ModelGeometry& g = reader.geometry();
  // Sinks + recent, re-applied, is sinks + recent of the whole sequence at every re-application:
  // after the last token the cache holds 4 sinks and the newest tokens, at most budget - 1 rows.
  const auto cfgs = configs({"streamingllm:phase=prefill,sinks=4"}, {0.25});
  Replayer replayer(reader, ReplayMode::QueryAware, cfgs, 0, BudgetRule{true, 3});
  const RequestResult r = replayer.replay("r0");
  const ConfigResult& x = r.configs[0];
  const std::int64_t peak = static_cast<std::int64_t>(std::floor(0.25 * static_cast<double>(h.n_prompt)));
  CHECK(x.budget_tokens == peak - 3);
  const double rows = static_cast<double>(g.n_layers) * g.n_kv_heads;
  const double kv = 4.0 * g.head_dim;
  // Right after compression: budget - 3 tokens per head; over the steps the cache grows to the
  // budget and is cut back to budget - 3 each time it would exceed it.
  CHECK(x.compressed_bytes == Approx(rows * static_cast<double>(peak - 3) * kv));
  CHECK(x.decode_peak_bytes == Approx(rows * static_cast<double>(peak) * kv));
  const std::int64_t steps = h.n_tokens() - h.n_prompt;
  std::int64_t size = peak - 3;
  for (std::int64_t i = 0; i < steps; ++i) {
    ++size;                                // joins
    if (size + 1 > peak) size = peak - 3;  // full: re-applied
  }
  CHECK(x.final_bytes == Approx(rows * static_cast<double>(size) * kv));
}
