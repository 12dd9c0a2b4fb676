// The synthetic generator must plant the structures real models show, and they must emerge from
// q.k: these tests recompute causal softmax attention from the stored K and Q and look for them.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "trace_fixtures.h"
#include "traces/trace_reader.h"

using namespace kvsim;

namespace {

// Attention rows of one query head over the causal prefix: a[i][j], j <= q_index[i].
std::vector<std::vector<double>> attention(const SynthConfig& cfg, const SynthPlan& plan, const SynthLayer& layer,
                                           int qh) {
  const ModelGeometry& g = cfg.geometry;
  const std::size_t d = static_cast<std::size_t>(g.head_dim), Hq = static_cast<std::size_t>(g.n_q_heads),
                    Hkv = static_cast<std::size_t>(g.n_kv_heads);
  const std::size_t kh = static_cast<std::size_t>(qh) / (Hq / Hkv);
  std::vector<std::vector<double>> rows;
  for (std::size_t i = 0; i < plan.header.q_index.size(); ++i) {
    const auto t = static_cast<std::size_t>(plan.header.q_index[i]);
    std::vector<double> s(t + 1);
    const float* q = &layer.q[(i * Hq + static_cast<std::size_t>(qh)) * d];
    for (std::size_t j = 0; j <= t; ++j) {
      const float* k = &layer.k[(j * Hkv + kh) * d];
      double dot = 0;
      for (std::size_t x = 0; x < d; ++x) dot += static_cast<double>(q[x]) * k[x];
      s[j] = dot / std::sqrt(static_cast<double>(d));
    }
    const double m = *std::max_element(s.begin(), s.end());
    double z = 0;
    for (auto& x : s) z += (x = std::exp(x - m));
    for (auto& x : s) x /= z;
    rows.push_back(std::move(s));
  }
  return rows;
}

double mean(const std::vector<double>& v) {
  return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

SynthConfig structure_config() {
  SynthConfig cfg;  // SmolLM2 geometry, but fewer layers and a shorter context to stay fast
  cfg.geometry.n_layers = 12;
  cfg.context_tokens = 600;
  cfg.n_requests = 1;
  cfg.seed = 11;
  return cfg;
}

}  // namespace

TEST_CASE("synthesis is deterministic in its seed", "[synth]") {
  const SynthConfig a = test::small_synth_config(5), b = test::small_synth_config(6);
  const SynthPlan pa = plan_synth_request(a, 0), pa2 = plan_synth_request(a, 0), pb = plan_synth_request(b, 0);
  CHECK(pa.header.tokens == pa2.header.tokens);
  CHECK(pa.heavy_hitters == pa2.heavy_hitters);
  CHECK(synth_layer(a, pa, 0, 1).k == synth_layer(a, pa2, 0, 1).k);
  CHECK(synth_layer(a, pa, 0, 1).q == synth_layer(a, pa2, 0, 1).q);
  CHECK(synth_layer(a, pa, 0, 1).k != synth_layer(b, pb, 0, 1).k);
  CHECK(pa.header.tokens != pb.header.tokens);
  // Different requests of one trace differ too.
  CHECK(plan_synth_request(a, 1).header.tokens != pa.header.tokens);
}

TEST_CASE("synthetic requests have the documented layout", "[synth]") {
  SynthConfig cfg = test::small_synth_config();
  cfg.all_queries = false;
  cfg.repeat_pass = false;
  cfg.query_window = 8;
  cfg.needle_depth = 0.5;
  const SynthPlan p = plan_synth_request(cfg, 0);
  const RequestHeader& h = p.header;
  CHECK(h.n_tokens() == 4 + 48 + 6 + 5);
  CHECK(h.question_start == 52);
  CHECK(h.segments[3] == 0);
  CHECK(h.segments[4] == 1);
  CHECK(h.segments[52] == 2);
  CHECK(h.segments[58] == 3);
  CHECK(h.q_index.front() == 52 - 8);
  CHECK(h.q_index.size() == 8 + 6 + 5);
  CHECK(h.needle_start == 4 + 22);
  CHECK(h.needle_end == h.needle_start + 4);
  CHECK(p.heavy_hitters.size() == 1);
  // Default depth spreads the needle over the requests: (r + 0.5) / n of the context.
  cfg.needle_depth = -1;
  CHECK(plan_synth_request(cfg, 0).header.needle_start == 4 + 7);  // floor(44 / 6)
  CHECK(plan_synth_request(cfg, 2).header.needle_start ==
        4 + 36);  // floor(44 * 5 / 6)  // 3% of 48 context tokens, rounded
  CHECK(h.problems(cfg.geometry, "t").empty());
  const ReferenceDistribution ref = synth_reference(cfg, p, 0);
  CHECK(ref.rows == 11);
  for (std::int32_t r = 0; r < ref.rows; ++r) {
    for (int j = 1; j < ref.topk; ++j) CHECK(ref.topk_logp[r * ref.topk + j] <= ref.topk_logp[r * ref.topk + j - 1]);
    if (ref.index[r] + 1 < h.n_tokens())  // the true next token leads the distribution
      CHECK(ref.topk_ids[r * ref.topk] == h.tokens[static_cast<std::size_t>(ref.index[r]) + 1]);
  }
}

TEST_CASE("bad synth configurations are reported field by field", "[synth]") {
  SynthConfig cfg;
  cfg.context_tokens = 10;
  cfg.needle_tokens = 16;
  cfg.geometry.n_kv_heads = 2;
  const auto p = cfg.problems();
  auto has = [&](const std::string& s) {
    return std::any_of(p.begin(), p.end(), [&](const std::string& e) { return e.find(s) != std::string::npos; });
  };
  CHECK(has("context tokens = 10, expected > needle tokens = 16"));
  CHECK(has("n_q_heads = 9 is not a multiple of model/n_kv_heads = 2"));
  CHECK_THROWS_WITH(plan_synth_request(cfg, 0), Catch::Contains("context tokens = 10"));
}

TEST_CASE("planted attention structure emerges from q.k", "[synth]") {
  const SynthConfig cfg = structure_config();
  const SynthPlan plan = plan_synth_request(cfg, 0);
  const RequestHeader& h = plan.header;
  const int L = cfg.geometry.n_layers, Hq = cfg.geometry.n_q_heads;
  const auto T = static_cast<std::size_t>(h.n_tokens());
  std::vector<double> retrieval_needle, other_needle, retrieval_context_needle, sink, local_recent, entropy_by_layer;
  std::vector<double> accumulated(T, 0.0);  // H2O-style score over the heavy heads
  for (int l = 0; l < L; ++l) {
    const SynthLayer layer = synth_layer(cfg, plan, 0, l);
    double layer_entropy = 0;
    for (int qh = 0; qh < Hq; ++qh) {
      const HeadRole role = plan.roles[static_cast<std::size_t>(l * Hq + qh)];
      const auto a = attention(cfg, plan, layer, qh);
      double ent = 0, sink_mass = 0, recent = 0, needle_q = 0, needle_c = 0;
      int n_late = 0, n_q = 0, n_c = 0;
      for (std::size_t i = 0; i < a.size(); ++i) {
        const auto t = static_cast<std::int64_t>(h.q_index[i]);
        const auto& row = a[i];
        const double needle = t < h.needle_start
                                  ? 0.0
                                  : std::accumulate(row.begin() + h.needle_start,
                                                    row.begin() + std::min<std::int64_t>(h.needle_end, t + 1), 0.0);
        if (t >= h.question_start) {
          needle_q += needle;
          ++n_q;
        } else if (t > h.needle_end + 64) {
          needle_c += needle;
          ++n_c;
        }
        if (t >= h.question_start - 64) {
          ++n_late;
          sink_mass += row[0];
          recent += std::accumulate(row.end() - std::min<std::ptrdiff_t>(32, static_cast<std::ptrdiff_t>(row.size())),
                                    row.end(), 0.0);
          for (double x : row) ent -= x > 0 ? x * std::log(x) : 0.0;
        }
        if (role == HeadRole::Heavy)
          for (std::size_t j = 0; j < row.size(); ++j) accumulated[j] += row[j];
      }
      layer_entropy += ent / n_late;
      if (role == HeadRole::Retrieval) {
        retrieval_needle.push_back(needle_q / n_q);
        retrieval_context_needle.push_back(needle_c / n_c);
      } else {
        other_needle.push_back(needle_q / n_q);
      }
      if (role != HeadRole::Broad) sink.push_back(sink_mass / n_late);
      if (role == HeadRole::Local) local_recent.push_back(recent / n_late);
    }
    entropy_by_layer.push_back(layer_entropy / Hq);
  }
  const double uniform_needle = static_cast<double>(h.needle_end - h.needle_start) / static_cast<double>(T);

  // Retrieval heads find the needle from the question, and only from the question.
  REQUIRE_FALSE(retrieval_needle.empty());
  CHECK(mean(retrieval_needle) > 0.5);
  CHECK(mean(retrieval_context_needle) < 5 * uniform_needle);
  CHECK(*std::max_element(other_needle.begin(), other_needle.end()) < 0.1);
  // Sinks: token 0 takes a large share in the non-broad heads (uniform would be 1/T).
  CHECK(mean(sink) > 0.15);
  CHECK(mean(sink) > 50.0 / static_cast<double>(T));
  // Recency: local heads put much more than 32/T of their mass on the last 32 tokens.
  REQUIRE_FALSE(local_recent.empty());
  CHECK(mean(local_recent) > 0.25);
  CHECK(mean(local_recent) > 6 * 32.0 / static_cast<double>(T));
  // Heavy hitters: the top tokens by accumulated attention (sink and local window excluded)
  // are mostly the planted ones.
  std::vector<std::int32_t> idx;
  for (std::int64_t j = 1; j < h.question_start - 64; ++j) idx.push_back(static_cast<std::int32_t>(j));
  std::sort(idx.begin(), idx.end(), [&](auto x, auto y) { return accumulated[x] > accumulated[y]; });
  const std::size_t n_heavy = plan.heavy_hitters.size();
  std::size_t found = 0;
  for (std::size_t i = 0; i < n_heavy; ++i)
    found += std::binary_search(plan.heavy_hitters.begin(), plan.heavy_hitters.end(), idx[i]);
  CHECK(static_cast<double>(found) >= 0.7 * static_cast<double>(n_heavy));
  // Entropy falls with depth: broad early layers, sharp late ones.
  CHECK(entropy_by_layer.front() > entropy_by_layer.back() + 1.0);
  CHECK(entropy_by_layer.front() > 0.9 * std::log(static_cast<double>(T)));
}

TEST_CASE("a synthetic trace written to disk passes validation and keeps the seed", "[synth]") {
  const SynthConfig cfg = test::small_synth_config(42);
  const std::string path = test::write_small_trace("synth_valid.h5", cfg);
  TraceReader reader(path);
  CHECK(reader.capture().seed == 42);
  CHECK(reader.capture().backend == "synthetic");
  CHECK(reader.capture().config.find("\"head_roles\"") != std::string::npos);
  CHECK(reader.request_ids().size() == 3);
}
