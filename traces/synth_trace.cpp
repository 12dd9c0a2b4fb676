#include "traces/synth_trace.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <numeric>
#include <random>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/rng.h"
#include "core/rope.h"
#include "traces/trace_writer.h"

namespace kvsim {

const char* head_role_name(HeadRole r) {
  switch (r) {
    case HeadRole::Broad:
      return "broad";
    case HeadRole::Local:
      return "local";
    case HeadRole::Heavy:
      return "heavy";
    case HeadRole::Retrieval:
      return "retrieval";
  }
  return "?";
}

namespace {

// Key amplitude along each planted direction; query coefficients are sized from the target
// logit so that (c * A) / sqrt(d) equals it.
constexpr double kKeyAmplitude = 4.0;

enum Stream : std::uint64_t { kRoles = 1, kDirections, kPlan, kKeys, kQueries, kReference };

// Per (layer, kv head) directions: orthonormal sink / salient / needle vectors on the
// content dims (slowest rotary pairs and unrotated dims) and a unit recency vector on the
// mid-frequency pairs.
struct HeadDirections {
  std::vector<float> sink, heavy, needle, local;
};

HeadDirections make_directions(const SynthConfig& cfg, int layer, int kv_head) {
  const ModelGeometry& g = cfg.geometry;
  const RopeSpec rope = g.rope;
  const int d = g.head_dim, pairs = g.rope.rope_dim / 2;
  std::vector<int> content;
  for (int i = pairs * 3 / 4; i < pairs; ++i) {
    content.push_back(rope_pair_first(rope, i));
    content.push_back(rope_pair_second(rope, i));
  }
  for (int j = g.rope.rope_dim; j < d; ++j) content.push_back(j);

  Rng rng(cfg.seed, kDirections, static_cast<std::uint64_t>(layer), static_cast<std::uint64_t>(kv_head));
  std::vector<std::vector<double>> basis;
  for (int n = 0; n < 3; ++n) {
    std::vector<double> v(content.size());
    for (auto& x : v) x = rng.normal();
    for (const auto& b : basis) {  // Gram-Schmidt against the earlier directions
      const double dot = std::inner_product(v.begin(), v.end(), b.begin(), 0.0);
      for (std::size_t i = 0; i < v.size(); ++i) v[i] -= dot * b[i];
    }
    const double norm = std::sqrt(std::inner_product(v.begin(), v.end(), v.begin(), 0.0));
    for (auto& x : v) x /= norm;
    basis.push_back(v);
  }
  HeadDirections dirs;
  std::vector<float>* outs[3] = {&dirs.sink, &dirs.heavy, &dirs.needle};
  for (int n = 0; n < 3; ++n) {
    outs[n]->assign(static_cast<std::size_t>(d), 0.0f);
    for (std::size_t i = 0; i < content.size(); ++i)
      (*outs[n])[static_cast<std::size_t>(content[i])] = static_cast<float>(basis[static_cast<std::size_t>(n)][i]);
  }
  dirs.local.assign(static_cast<std::size_t>(d), 0.0f);
  const int lo = pairs / 8, hi = pairs / 2;
  if (hi > lo) {
    const double amp = 1.0 / std::sqrt(static_cast<double>(hi - lo));
    for (int i = lo; i < hi; ++i) {
      const double phi = 2.0 * M_PI * rng.uniform();
      dirs.local[static_cast<std::size_t>(rope_pair_first(rope, i))] = static_cast<float>(amp * std::cos(phi));
      dirs.local[static_cast<std::size_t>(rope_pair_second(rope, i))] = static_cast<float>(amp * std::sin(phi));
    }
  }
  return dirs;
}

std::vector<HeadRole> make_roles(const SynthConfig& cfg) {
  const ModelGeometry& g = cfg.geometry;
  const int L = g.n_layers, H = g.n_q_heads;
  const int broad_layers = L > 1 ? std::max(1, L / 10) : 0;
  std::vector<HeadRole> roles(static_cast<std::size_t>(L * H));
  bool any_retrieval = false;
  for (int l = 0; l < L; ++l) {
    for (int h = 0; h < H; ++h) {
      Rng rng(cfg.seed, kRoles, static_cast<std::uint64_t>(l), static_cast<std::uint64_t>(h));
      const double u = rng.uniform(), u2 = rng.uniform();
      HeadRole r;
      if (l < broad_layers)
        r = HeadRole::Broad;
      else if (l >= L / 3 && u < cfg.retrieval_head_fraction)
        r = HeadRole::Retrieval;
      else
        r = u2 < 0.5 ? HeadRole::Local : HeadRole::Heavy;
      any_retrieval |= r == HeadRole::Retrieval;
      roles[static_cast<std::size_t>(l * H + h)] = r;
    }
  }
  // A needle task needs someone to find the needle: guarantee one retrieval head.
  if (!any_retrieval && cfg.retrieval_head_fraction > 0) {
    const int l = std::max(broad_layers, L / 3 < L ? L / 3 : L - 1);
    roles[static_cast<std::size_t>(std::min(l, L - 1) * H)] = HeadRole::Retrieval;
  }
  return roles;
}

double layer_scale(const SynthConfig& cfg, int layer) {
  const int L = cfg.geometry.n_layers;
  const double t = L > 1 ? static_cast<double>(layer) / (L - 1) : 1.0;
  return cfg.min_layer_scale + (cfg.max_layer_scale - cfg.min_layer_scale) * t;
}

struct QueryMix {
  double sink, heavy, local, needle;  // target logits (before the layer scale)
};

QueryMix query_mix(const SynthConfig& cfg, HeadRole role, Rng& rng) {
  const double jitter = 0.7 + 0.6 * rng.uniform();
  switch (role) {
    case HeadRole::Broad:
      return {0.3 * cfg.sink_logit, 0.3 * cfg.heavy_logit, 0.3 * cfg.local_logit, 0.0};
    case HeadRole::Local:
      return {jitter * cfg.sink_logit, 0.4 * cfg.heavy_logit, cfg.local_logit, 0.0};
    case HeadRole::Heavy:
      return {jitter * cfg.sink_logit, cfg.heavy_logit, 0.5 * cfg.local_logit, 0.0};
    case HeadRole::Retrieval:
      return {jitter * cfg.sink_logit, 0.4 * cfg.heavy_logit, 0.5 * cfg.local_logit, cfg.needle_logit};
  }
  return {};
}

void axpy(float* y, const std::vector<float>& x, double a) {
  for (std::size_t i = 0; i < x.size(); ++i) y[i] += static_cast<float>(a * x[i]);
}

}  // namespace

std::vector<std::string> SynthConfig::problems() const {
  std::vector<std::string> out = geometry_problems(geometry, "synth");
  auto need = [&](bool ok, const std::string& msg) {
    if (!ok) out.push_back("synth: " + msg);
  };
  // Sink, salient and needle directions need 3 orthogonal slow ("content") dims: the slowest
  // quarter of the rotary pairs plus any unrotated dims.
  const int pairs = geometry.rope.rope_dim / 2;
  const int content_dims = 2 * (pairs - pairs * 3 / 4) + (geometry.head_dim - geometry.rope.rope_dim);
  need(content_dims >= 3, "head_dim = " + std::to_string(geometry.head_dim) +
                              " with rope_dim = " + std::to_string(geometry.rope.rope_dim) + " leaves " +
                              std::to_string(content_dims) + " slow dims, expected >= 3 (use head_dim >= 16)");
  need(n_requests >= 1, "requests = " + std::to_string(n_requests) + ", expected >= 1");
  need(system_tokens >= 1, "system tokens = " + std::to_string(system_tokens) + ", expected >= 1 (holds the sink)");
  need(needle_tokens >= 1, "needle tokens = " + std::to_string(needle_tokens) + ", expected >= 1");
  need(context_tokens > needle_tokens, "context tokens = " + std::to_string(context_tokens) +
                                           ", expected > needle tokens = " + std::to_string(needle_tokens));
  need(question_tokens >= 1, "question tokens = " + std::to_string(question_tokens) + ", expected >= 1");
  need(generated_tokens >= 0, "generated tokens = " + std::to_string(generated_tokens) + ", expected >= 0");
  need(needle_depth <= 1, "needle depth = " + std::to_string(needle_depth) + ", expected in [0, 1] (or < 0: spread)");
  need(!repeat_pass || all_queries, "a repeat pass copies the context's queries, expected all queries");
  need(query_window >= 1, "query window = " + std::to_string(query_window) + ", expected >= 1");
  need(ref_topk >= 1 && ref_topk <= geometry.vocab,
       "ref top-k = " + std::to_string(ref_topk) + ", expected in [1, vocab = " + std::to_string(geometry.vocab) + "]");
  need(heavy_fraction >= 0 && heavy_fraction <= 0.5, "heavy fraction expected in [0, 0.5]");
  need(retrieval_head_fraction >= 0 && retrieval_head_fraction <= 1, "retrieval head fraction expected in [0, 1]");
  need(noise >= 0, "noise expected >= 0");
  need(min_layer_scale > 0 && max_layer_scale > 0, "layer scales expected > 0");
  const double total = static_cast<double>(system_tokens) + context_tokens + question_tokens + generated_tokens;
  need(total < 2147483647.0, "total tokens per request must fit in int32");
  return out;
}

std::string SynthConfig::to_json() const {
  nlohmann::json j;
  j["generator"] = "kvsim trace synth";
  j["seed"] = seed;
  j["requests"] = n_requests;
  j["system_tokens"] = system_tokens;
  j["context_tokens"] = context_tokens;
  j["question_tokens"] = question_tokens;
  j["generated_tokens"] = generated_tokens;
  j["needle_tokens"] = needle_tokens;
  j["needle_depth"] = needle_depth;
  j["queries"] = all_queries ? "all" : "eval";
  j["query_window"] = query_window;
  j["repeat_pass"] = repeat_pass;
  j["ref_topk"] = ref_topk;
  j["heavy_fraction"] = heavy_fraction;
  j["retrieval_head_fraction"] = retrieval_head_fraction;
  j["sink_logit"] = sink_logit;
  j["heavy_logit"] = heavy_logit;
  j["needle_logit"] = needle_logit;
  j["local_logit"] = local_logit;
  j["noise"] = noise;
  j["min_layer_scale"] = min_layer_scale;
  j["max_layer_scale"] = max_layer_scale;
  // Ground truth for analysis: which query heads were built as which kind.
  const auto roles = make_roles(*this);
  nlohmann::json per_layer = nlohmann::json::array();
  for (int l = 0; l < geometry.n_layers; ++l) {
    nlohmann::json row = nlohmann::json::array();
    for (int h = 0; h < geometry.n_q_heads; ++h)
      row.push_back(head_role_name(roles[static_cast<std::size_t>(l * geometry.n_q_heads + h)]));
    per_layer.push_back(row);
  }
  j["head_roles"] = per_layer;
  return j.dump();
}

SynthPlan plan_synth_request(const SynthConfig& cfg, int request) {
  const auto problems = cfg.problems();
  if (!problems.empty()) {
    std::string msg;
    for (const auto& p : problems) msg += (msg.empty() ? "" : "\n") + p;
    throw Error(msg);
  }
  const ModelGeometry& g = cfg.geometry;
  SynthPlan plan;
  RequestHeader& h = plan.header;
  const int S = cfg.system_tokens, C = cfg.context_tokens, Q = cfg.question_tokens, G = cfg.generated_tokens;
  const int T = S + C + Q + G;
  h.id = "r" + std::to_string(request);
  h.task = "synthetic_needle";
  Rng rng(cfg.seed, kPlan, static_cast<std::uint64_t>(request));
  h.tokens.resize(static_cast<std::size_t>(T));
  const std::uint64_t lo = g.vocab > 3 ? 3 : 0;
  for (int i = 0; i < T; ++i)
    h.tokens[static_cast<std::size_t>(i)] =
        static_cast<std::int32_t>(lo + rng.below(static_cast<std::uint64_t>(g.vocab) - lo));
  if (g.vocab > 1) h.tokens[0] = 1;  // chat-template start token, where sinks form
  h.positions.resize(static_cast<std::size_t>(T));
  std::iota(h.positions.begin(), h.positions.end(), 0);
  h.segments.resize(static_cast<std::size_t>(T));
  for (int i = 0; i < T; ++i) {
    const Segment s = i < S           ? Segment::System
                      : i < S + C     ? Segment::Context
                      : i < S + C + Q ? Segment::Question
                                      : Segment::Generated;
    h.segments[static_cast<std::size_t>(i)] = static_cast<std::int8_t>(s);
  }
  const int first_q = cfg.all_queries ? 0 : std::max(0, S + C - cfg.query_window);
  for (int i = first_q; i < T; ++i) h.q_index.push_back(i);
  h.n_prompt = S + C + Q;
  h.n_generated = G;
  h.question_start = S + C;
  const double depth = cfg.needle_depth >= 0 ? cfg.needle_depth : (request + 0.5) / cfg.n_requests;
  h.needle_start = S + static_cast<std::int64_t>(std::floor(depth * (C - cfg.needle_tokens)));
  h.needle_end = h.needle_start + cfg.needle_tokens;
  h.answer = "needle@" + std::to_string(h.needle_start);
  h.ref_rows = T - S - C;
  h.ref_topk = cfg.ref_topk;

  // Heavy hitters: a sample of context tokens outside the needle (partial Fisher-Yates).
  std::vector<std::int32_t> pool;
  for (int i = S; i < S + C; ++i)
    if (i < h.needle_start || i >= h.needle_end) pool.push_back(i);
  const auto n_heavy = std::min(pool.size(), static_cast<std::size_t>(std::llround(cfg.heavy_fraction * C)));
  for (std::size_t i = 0; i < n_heavy; ++i) std::swap(pool[i], pool[i + rng.below(pool.size() - i)]);
  plan.heavy_hitters.assign(pool.begin(), pool.begin() + static_cast<std::ptrdiff_t>(n_heavy));
  std::sort(plan.heavy_hitters.begin(), plan.heavy_hitters.end());
  plan.roles = make_roles(cfg);
  return plan;
}

SynthLayer synth_layer(const SynthConfig& cfg, const SynthPlan& plan, int request, int layer) {
  const ModelGeometry& g = cfg.geometry;
  const RequestHeader& h = plan.header;
  const RopeSpec rope = g.rope;
  const std::size_t d = static_cast<std::size_t>(g.head_dim);
  const std::size_t T = h.tokens.size(), Tq = h.q_index.size();
  const std::size_t Hkv = static_cast<std::size_t>(g.n_kv_heads), Hq = static_cast<std::size_t>(g.n_q_heads);
  const double sqrt_d = std::sqrt(static_cast<double>(d));
  const double scale = layer_scale(cfg, layer);

  std::vector<char> heavy(T, 0);
  for (auto i : plan.heavy_hitters) heavy[static_cast<std::size_t>(i)] = 1;
  std::vector<float> heavy_amp(T, 0.0f);

  SynthLayer out;
  out.k.assign(T * Hkv * d, 0.0f);
  out.v.assign(T * Hkv * d, 0.0f);
  out.q.assign(Tq * Hq * d, 0.0f);
  std::vector<HeadDirections> dirs;
  for (std::size_t kh = 0; kh < Hkv; ++kh) dirs.push_back(make_directions(cfg, layer, static_cast<int>(kh)));

  for (std::size_t kh = 0; kh < Hkv; ++kh) {
    Rng rng(cfg.seed, kKeys, static_cast<std::uint64_t>(request), static_cast<std::uint64_t>(layer), kh);
    const HeadDirections& dir = dirs[kh];
    for (std::size_t t = 0; t < T; ++t) {
      float* k = &out.k[(t * Hkv + kh) * d];
      float* v = &out.v[(t * Hkv + kh) * d];
      for (std::size_t j = 0; j < d; ++j) k[j] = static_cast<float>(cfg.noise * rng.normal());
      axpy(k, dir.local, kKeyAmplitude);
      if (t == 0) axpy(k, dir.sink, kKeyAmplitude);
      const double amp = 0.6 + 0.4 * rng.uniform();
      if (heavy[t]) axpy(k, dir.heavy, amp * kKeyAmplitude);
      if (static_cast<std::int64_t>(t) >= h.needle_start && static_cast<std::int64_t>(t) < h.needle_end)
        axpy(k, dir.needle, kKeyAmplitude);
      // Values: lognormal per-token scale; the sink's value is small, as in real models.
      const double vscale = std::exp(0.3 * rng.normal()) * (t == 0 ? 0.2 : 1.0);
      for (std::size_t j = 0; j < d; ++j) v[j] = static_cast<float>(vscale * rng.normal());
    }
  }
  for (std::size_t qh = 0; qh < Hq; ++qh) {
    const std::size_t kh = qh / (Hq / Hkv);
    const HeadDirections& dir = dirs[kh];
    const HeadRole role = plan.roles[static_cast<std::size_t>(layer) * Hq + qh];
    Rng role_rng(cfg.seed, kRoles + 100, static_cast<std::uint64_t>(layer), qh);
    const QueryMix mix = query_mix(cfg, role, role_rng);
    Rng rng(cfg.seed, kQueries, static_cast<std::uint64_t>(request), static_cast<std::uint64_t>(layer), qh);
    const double c = scale * sqrt_d / kKeyAmplitude;  // target logit -> query coefficient
    for (std::size_t i = 0; i < Tq; ++i) {
      const auto t = static_cast<std::size_t>(h.q_index[i]);
      float* q = &out.q[(i * Hq + qh) * d];
      for (std::size_t j = 0; j < d; ++j) q[j] = static_cast<float>(scale * cfg.noise * rng.normal());
      axpy(q, dir.sink, c * mix.sink);
      axpy(q, dir.heavy, c * mix.heavy);
      // The recency vector's key part has amplitude kKeyAmplitude: this makes q·k at distance 0
      // equal the local logit, falling off as the rotary pairs decorrelate.
      axpy(q, dir.local, c * mix.local);
      const auto seg = static_cast<Segment>(h.segments[t]);
      if (mix.needle > 0 && (seg == Segment::Question || seg == Segment::Generated))
        axpy(q, dir.needle, c * mix.needle);
    }
  }
  for (std::size_t t = 0; t < T; ++t) apply_rope(rope, &out.k[t * Hkv * d], static_cast<int>(Hkv), h.positions[t]);
  for (std::size_t i = 0; i < Tq; ++i) {
    const auto t = static_cast<std::size_t>(h.q_index[i]);
    apply_rope(rope, &out.q[i * Hq * d], static_cast<int>(Hq), h.positions[t]);
  }
  return out;
}

ReferenceDistribution synth_reference(const SynthConfig& cfg, const SynthPlan& plan, int request) {
  const RequestHeader& h = plan.header;
  const auto V = static_cast<std::size_t>(cfg.geometry.vocab);
  const auto k = static_cast<std::size_t>(h.ref_topk);
  ReferenceDistribution ref;
  ref.rows = h.ref_rows;
  ref.topk = h.ref_topk;
  Rng rng(cfg.seed, kReference, static_cast<std::uint64_t>(request));
  std::vector<double> z(V);
  std::vector<std::int32_t> order(V);
  const auto T = static_cast<std::int32_t>(h.tokens.size());
  for (std::int32_t i = T - h.ref_rows; i < T; ++i) {
    for (auto& x : z) x = 1.5 * rng.normal();
    if (i + 1 < T) z[static_cast<std::size_t>(h.tokens[static_cast<std::size_t>(i) + 1])] += 8.0;
    const double zmax = *std::max_element(z.begin(), z.end());
    double sum = 0;
    for (double x : z) sum += std::exp(x - zmax);
    const double lse = zmax + std::log(sum);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                      [&](std::int32_t a, std::int32_t b) { return z[a] != z[b] ? z[a] > z[b] : a < b; });
    ref.index.push_back(i);
    ref.lse.push_back(static_cast<float>(lse));
    for (std::size_t j = 0; j < k; ++j) {
      ref.topk_ids.push_back(order[j]);
      ref.topk_logp.push_back(static_cast<float>(z[static_cast<std::size_t>(order[j])] - lse));
    }
  }
  return ref;
}

CaptureInfo synth_capture_info(const SynthConfig& cfg) {
  CaptureInfo info;
  info.tool_version = "kvsim 0.1.0";
  info.backend = "synthetic";
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  info.date = buf;
  info.seed = cfg.seed;
  info.config = cfg.to_json();
  return info;
}

void write_synth_trace(const SynthConfig& cfg, TraceWriter& writer) {
  for (int r = 0; r < cfg.n_requests; ++r) {
    const SynthPlan plan = plan_synth_request(cfg, r);
    writer.begin_request(plan.header);
    const RequestHeader& h = plan.header;
    // The synthetic repeat pass: the context, [system_tokens, question_start), once more.
    RepeatPass repeat;
    const std::int64_t begin = cfg.system_tokens, end = h.question_start;
    if (cfg.repeat_pass) repeat.chunks.push_back({begin, end, 0, end - begin});
    repeat.rows = cfg.repeat_pass ? end - begin : 0;
    const auto d = static_cast<std::size_t>(cfg.geometry.head_dim);
    const auto Hq = static_cast<std::size_t>(cfg.geometry.n_q_heads),
               Hkv = static_cast<std::size_t>(cfg.geometry.n_kv_heads);
    for (int l = 0; l < cfg.geometry.n_layers; ++l) {
      const SynthLayer layer = synth_layer(cfg, plan, r, l);
      writer.write_layer_f32(l, layer.k, layer.v, layer.q);
      if (!cfg.repeat_pass) continue;
      // all_queries: q_index is every token, so query row t is token t.
      repeat.q.emplace_back(layer.q.begin() + static_cast<std::ptrdiff_t>(begin * Hq * d),
                            layer.q.begin() + static_cast<std::ptrdiff_t>(end * Hq * d));
      repeat.k.emplace_back(layer.k.begin() + static_cast<std::ptrdiff_t>(begin * Hkv * d),
                            layer.k.begin() + static_cast<std::ptrdiff_t>(end * Hkv * d));
    }
    writer.write_reference(synth_reference(cfg, plan, r));
    if (cfg.repeat_pass) writer.write_repeat_pass(repeat);
    writer.commit_request();
  }
}

}  // namespace kvsim
