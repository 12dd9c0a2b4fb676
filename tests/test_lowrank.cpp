// Low-rank storage: full rank reconstructs (to fp16 precision) through RoPE's inverse and back
// for both pairings, error falls with rank, bytes match a hand count (bases charged for the
// columns used, calibration bases amortised), the audit's worked numbers keep every token, and
// VarRate spends its budget with every kept token at r_min or more.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <random>

#include "kvcache/cache_signals.h"
#include "policies/basis_set.h"
#include "policies/lowrank.h"
#include "policies/registry.h"
#include "sim/calibration.h"
#include "sim/replay.h"
#include "trace_fixtures.h"

using namespace kvsim;

namespace {

ModelGeometry geometry(RopeType type) {
  ModelGeometry g;
  g.n_layers = 1;
  g.n_q_heads = 2;
  g.n_kv_heads = 1;
  g.head_dim = 16;
  g.rope = RopeSpec{type, 16, 16, 10000.0};
  return g;
}

// Tokens whose pre-RoPE keys live mostly in a few directions (as real keys do), then rotated.
void make_tokens(const ModelGeometry& g, std::int64_t n, std::vector<float>& k, std::vector<float>& v,
                 std::vector<std::int32_t>& pos) {
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  const int d = g.head_dim;
  k.assign(static_cast<std::size_t>(n * d), 0);
  v = k;
  pos.resize(static_cast<std::size_t>(n));
  for (std::int64_t j = 0; j < n; ++j) {
    pos[static_cast<std::size_t>(j)] = static_cast<std::int32_t>(j);
    for (int i = 0; i < d; ++i) {
      const float scale = 4.0f / static_cast<float>(1 + i);
      k[static_cast<std::size_t>(j * d + i)] = nd(rng) * scale;
      v[static_cast<std::size_t>(j * d + i)] = nd(rng) * scale;
    }
    apply_rope(g.rope, k.data() + j * d, 1, j);
  }
}

double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += a[i] * a[i];
  }
  return std::sqrt(num / den);
}

}  // namespace

TEST_CASE("low-rank reconstruction: exact at full rank, error falls with rank, both RoPE pairings", "[lowrank]") {
  for (const RopeType type : {RopeType::Norm, RopeType::Neox}) {
    const ModelGeometry g = geometry(type);
    std::vector<float> k, v;
    std::vector<std::int32_t> pos;
    make_tokens(g, 64, k, v, pos);
    double prev = 1e30;
    for (const int r : {2, 4, 8, 16}) {
      HeadPlan plan;
      plan.codec.assign(64, TokenCodec::LowRank);
      plan.rank.assign(64, static_cast<std::uint16_t>(r));
      auto kh = k, vh = v;
      LowRankCodec().reconstruct(plan, g, pos, kh, vh);
      const double e = rel_err(k, kh) + rel_err(v, vh);
      INFO("rank " << r << (type == RopeType::Neox ? " neox" : " norm"));
      CHECK(e < prev);
      prev = e;
      if (r == 16) {
        CHECK(rel_err(k, kh) < 2e-3);  // fp16 basis and coefficients
        CHECK(rel_err(v, vh) < 2e-3);
      }
    }
  }
}

TEST_CASE("a head rebuilt from its plan's own fit does not read the rows it is handed", "[lowrank]") {
  const ModelGeometry g = geometry(RopeType::Neox);
  std::vector<float> k, v;
  std::vector<std::int32_t> pos;
  make_tokens(g, 64, k, v, pos);
  HeadPlan plan;
  plan.codec.assign(64, TokenCodec::LowRank);
  plan.rank.assign(64, 3);
  for (std::size_t j = 0; j < 64; j += 5) plan.codec[j] = TokenCodec::Drop;
  const LowRankCodec codec;
  CHECK(codec.reads_rows(plan));  // no fit: rebuild fits the kept rows themselves
  plan.data = fit_lowrank(g, k, v, pos);
  REQUIRE_FALSE(codec.reads_rows(plan));
  // The kept rows, and the same shape filled with NaN: both rebuild to the same cache.
  std::vector<float> kk, vk;
  std::vector<std::int32_t> kept_pos;
  for (std::size_t j = 0; j < 64; ++j) {
    if (plan.codec[j] == TokenCodec::Drop) continue;
    kk.insert(kk.end(), k.begin() + static_cast<std::ptrdiff_t>(j * 16),
              k.begin() + static_cast<std::ptrdiff_t>(j * 16 + 16));
    vk.insert(vk.end(), v.begin() + static_cast<std::ptrdiff_t>(j * 16),
              v.begin() + static_cast<std::ptrdiff_t>(j * 16 + 16));
    kept_pos.push_back(pos[j]);
  }
  std::vector<float> kn(kk.size(), std::nanf("")), vn(vk.size(), std::nanf(""));
  codec.reconstruct(plan, g, kept_pos, kk, vk);
  codec.reconstruct(plan, g, kept_pos, kn, vn);
  CHECK(kn == kk);
  CHECK(vn == vk);
  plan.codec[1] = TokenCodec::Fp16;  // an fp16 row passes through: it must be gathered
  CHECK(codec.reads_rows(plan));
}

TEST_CASE("low-rank bytes: coefficients, rank bytes when ranks differ, fp16 tokens, the bases' used columns",
          "[lowrank]") {
  HeadPlan plan;
  plan.codec = {TokenCodec::LowRank, TokenCodec::LowRank, TokenCodec::Drop, TokenCodec::Fp16};
  plan.rank = {2, 5, 0, 0};
  // d = 16: coefficients 4 x (2 + 5), 2 rank bytes (ranks differ), fp16 token 64, and the first
  // r_max = 5 columns of both fp16 bases: 2 x 16 x 5 x 2 bytes.
  CHECK(lowrank_bytes(plan, 16) == 28 + 2 + 64 + 320);
  plan.rank = {3, 3, 0, 0};  // one rank for all: no rank bytes
  CHECK(lowrank_bytes(plan, 16) == 24 + 64 + 192);
  // A calibration basis is held whole and shared: 2 x 16 x 16 x 2 bytes over the requests it serves.
  auto fit = std::make_shared<LowRankFit>();
  fit->n = 4;
  fit->charge = BasisCharge{true, 8};
  plan.data = fit;
  CHECK(lowrank_bytes(plan, 16) == 24 + 64 + 1024.0 / 8);
  plan.codec = {TokenCodec::Fp16, TokenCodec::Drop, TokenCodec::Drop, TokenCodec::Fp16};
  CHECK(lowrank_bytes(plan, 16) == 128);  // no low-rank token: no basis stored
}

namespace {

// One layer, one KV head (two query heads) of n tokens with every query recorded, as a policy
// sees it at a compression point after the last one.
struct OneHeadCache {
  ModelGeometry g;
  RequestHeader h;
  kvcache::FloatBuffer q;
  kvcache::CacheView view;
  std::unique_ptr<kvcache::CacheSignals> signals;
  OneHeadCache(int d, std::int64_t n) {
    g = geometry(RopeType::Neox);
    g.head_dim = d;
    g.rope = RopeSpec{RopeType::Neox, d, d, 10000.0};
    std::vector<float> k, v;
    std::vector<std::int32_t> pos;
    make_tokens(g, n, k, v, pos);
    h.id = "r";
    for (std::int64_t t = 0; t < n; ++t) {
      h.tokens.push_back(1);
      h.positions.push_back(pos[static_cast<std::size_t>(t)]);
      h.segments.push_back(1);
      h.q_index.push_back(static_cast<std::int32_t>(t));
    }
    h.n_prompt = h.question_start = n;
    std::mt19937 rng(4);
    std::normal_distribution<float> nd;
    q.resize(static_cast<std::size_t>(n * g.n_q_heads * d));
    for (auto& x : q) x = nd(rng);
    view.tokens.emplace_back(h.q_index);
    view.keys.push_back(Eigen::Map<const kvcache::Mat>(k.data(), n, d));
    view.values.push_back(Eigen::Map<const kvcache::Mat>(v.data(), n, d));
    signals = std::make_unique<kvcache::CacheSignals>(
        "test", g, 0, n, kvcache::RequestTokens{h.positions, h.segments, h.q_index}, q, view);
  }
  HeadPlan plan(const std::string& spec, double fraction) const {
    const PolicyInstance p = PolicyRegistry::instance().create(spec);
    const Budget budget{0, fraction};
    return p.policy->compress(*signals, budget).heads.at(0);
  }
};

}  // namespace

TEST_CASE("low-rank at the audit's worked numbers: d = 128, budget 0.1, 1000 tokens keeps every token", "[lowrank]") {
  // Per head the budget is 0.1 x 1000 x 512 B = 51200 B. Uniform rank r costs 4 r (1000 + 128):
  // r = 11 fits (49632 B), 12 does not. Charged two full 128 x 128 bases and a rank byte per
  // token, rank 1 did not fit at all and every token was dropped.
  const OneHeadCache cache(128, 1000);
  const HeadPlan uni = cache.plan("lowrank", 0.1);
  CHECK(uni.kept() == 1000);
  CHECK_FALSE(uni.position_fallback);
  for (std::size_t j = 0; j < uni.codec.size(); ++j) {
    INFO("token " << j);
    REQUIRE(uni.codec[j] == TokenCodec::LowRank);
    REQUIRE(uni.rank[j] == 11);
  }
  CHECK(lowrank_bytes(uni, 128) == 4.0 * 11 * 1128);
  const HeadPlan var = cache.plan("varrate", 0.1);
  CHECK(var.kept() == 1000);
  CHECK_FALSE(var.position_fallback);
  for (auto r : var.rank) REQUIRE(r >= 1);
  CHECK(lowrank_bytes(var, 128) <= 51200);
  CHECK(lowrank_bytes(var, 128) > 0.95 * 51200);
  // Below every token at rank 1 (4 x (1000 + 128) B), the policies keep sinks + recent by
  // position and say so.
  const HeadPlan tight = cache.plan("lowrank", 0.008);
  CHECK(tight.position_fallback);
  CHECK(tight.kept() < 1000);
  CHECK(tight.kept() > 0);
}

TEST_CASE("calibration bases: their bytes are amortised over the requests they serve", "[lowrank]") {
  const OneHeadCache cache(32, 200);
  BasisSet set;
  set.n_layers = 1;
  set.n_kv_heads = 1;
  set.head_dim = 32;
  set.rope = cache.g.rope;
  set.tokens = 200;
  set.source = "unit test";
  {
    GramAccumulator acc;
    const MatrixView K = cache.signals->keys(0), V = cache.signals->values(0);
    acc.add(cache.g, {K.data, static_cast<std::size_t>(K.rows * K.cols)},
            {V.data, static_cast<std::size_t>(V.rows * V.cols)}, cache.h.positions);
    set.heads = {acc.basis()};
  }
  const std::string path = test::scratch_file("amortised.basis");
  save_basis_set(set, path);
  // serves = 1: the whole 2 x 32 x 32 fp16 pair on this request; serves = 100: a hundredth.
  const HeadPlan one = cache.plan("lowrank:basis=" + path + ",serves=1", 0.2);
  const HeadPlan many = cache.plan("lowrank:basis=" + path + ",serves=100", 0.2);
  const double budget = 0.2 * 200 * 128;
  CHECK(lowrank_bytes(one, 32) == 4.0 * one.rank[0] * 200 + 4096);
  CHECK(lowrank_bytes(many, 32) == Approx(4.0 * many.rank[0] * 200 + 40.96));
  CHECK(lowrank_bytes(one, 32) <= budget);
  CHECK(lowrank_bytes(many, 32) <= budget);
  CHECK(many.rank[0] > one.rank[0]);
  CHECK_THROWS_WITH(cache.plan("lowrank:basis=" + path + ",serves=0.5", 0.2), Catch::Contains("'serves' = 0.5"));
}

TEST_CASE("varrate keeps every token at r_min or more and spends its coefficient budget", "[lowrank]") {
  SynthConfig cfg = test::small_synth_config(5);
  cfg.n_requests = 1;
  cfg.context_tokens = 200;
  cfg.generated_tokens = 4;
  const TraceReader reader(test::write_small_trace("varrate.h5", cfg));
  PolicyInstance var = PolicyRegistry::instance().create("varrate:r_min=2,window=8");
  PolicyInstance uni = PolicyRegistry::instance().create("lowrank");
  const std::vector<ReplayConfig> cfgs = {
      {var.name, var.params, std::shared_ptr<const Policy>(std::move(var.policy)), 0.6},
      {uni.name, uni.params, std::shared_ptr<const Policy>(std::move(uni.policy)), 0.6}};
  const RequestResult res = Replayer(reader, ReplayMode::QueryAware, cfgs).replay(reader.request_ids().front());
  for (const auto& r : res.configs) {
    CHECK(r.kept_fraction == 1.0);
    CHECK(r.compressed_bytes <= r.budget_bytes);
    CHECK(r.position_fallback == 0);
  }
  // VarRate spends to within a few coefficients; one uniform rank for all leaves up to a rank
  // step (4 (n + d) B per head) unspent.
  CHECK(res.configs[0].compressed_bytes > 0.95 * res.configs[0].budget_bytes);
  CHECK(res.configs[1].compressed_bytes > 0.85 * res.configs[1].budget_bytes);
}

TEST_CASE("calibration bases: a file round-trips, bad files and other geometries are named", "[lowrank]") {
  const ModelGeometry g = geometry(RopeType::Neox);
  std::vector<float> k, v;
  std::vector<std::int32_t> pos;
  make_tokens(g, 40, k, v, pos);
  GramAccumulator acc;
  acc.add(g, std::span(k).first(20 * 16), std::span(v).first(20 * 16), std::span(pos).first(20));
  acc.add(g, std::span(k).subspan(20 * 16), std::span(v).subspan(20 * 16), std::span(pos).subspan(20));
  // Accumulating in two parts fits the same bases as fitting all tokens at once.
  const HeadBasis whole = fit_basis(g, k, v, pos), parts = acc.basis();
  CHECK(acc.tokens == 40);
  for (std::size_t i = 0; i < whole.uk.size(); ++i) {
    CHECK(std::abs(std::abs(whole.uk[i]) - std::abs(parts.uk[i])) < 1e-3);
    CHECK(std::abs(std::abs(whole.uv[i]) - std::abs(parts.uv[i])) < 1e-3);
  }
  BasisSet set;
  set.n_layers = 1;
  set.n_kv_heads = 1;
  set.head_dim = 16;
  set.rope = g.rope;
  set.tokens = acc.tokens;
  set.source = "unit test";
  set.heads = {parts};
  const std::string path = test::scratch_file("unit.basis");
  save_basis_set(set, path);
  const BasisSet back = load_basis_set(path);
  CHECK(back.heads.size() == 1);
  CHECK(back.at(0, 0).uk == parts.uk);
  CHECK(back.at(0, 0).uv == parts.uv);
  CHECK(back.source == "unit test");
  CHECK(back.tokens == 40);
  CHECK_NOTHROW(check_basis_set(back, g));
  ModelGeometry other = g;
  other.head_dim = 32;
  CHECK_THROWS_WITH(check_basis_set(back, other), Catch::Contains("head_dim = 16, expected 32"));
  other = g;
  other.rope.type = RopeType::Norm;
  CHECK_THROWS_WITH(check_basis_set(back, other), Catch::Contains("rope_type"));
  // A truncated copy and a file of another kind.
  {
    std::ifstream in(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(path + ".cut", std::ios::binary) << bytes.substr(0, bytes.size() - 10);
    std::ofstream(path + ".txt") << "hello";
  }
  CHECK_THROWS_WITH(load_basis_set(path + ".cut"), Catch::Contains("truncated in the bases"));
  CHECK_THROWS_WITH(load_basis_set(path + ".txt"), Catch::Contains("not a kvsim basis file"));
  CHECK_THROWS_WITH(load_basis_set(path + ".absent"), Catch::Contains("cannot open basis file"));
}

TEST_CASE("bases calibrated on the request's own tokens are the request's own fit", "[lowrank]") {
  // A calibration set fitted on exactly the cached tokens gives the training-free fit's bases,
  // so every token's coefficients agree (up to each direction's sign).
  const OneHeadCache cache(16, 120);
  BasisSet set;
  set.n_layers = 1, set.n_kv_heads = 1, set.head_dim = 16;
  set.rope = cache.g.rope;
  GramAccumulator acc;
  const MatrixView K = cache.signals->keys(0), V = cache.signals->values(0);
  acc.add(cache.g, {K.data, static_cast<std::size_t>(K.rows * K.cols)},
          {V.data, static_cast<std::size_t>(V.rows * V.cols)}, cache.h.positions);
  set.heads = {acc.basis()};
  const auto own = layer_fits(*cache.signals, nullptr).at(0),
             calibrated = layer_fits(*cache.signals, std::make_shared<const BasisSet>(set)).at(0);
  CHECK_FALSE(own->charge.shared);
  CHECK(calibrated->charge.shared);
  REQUIRE(own->ck.size() == calibrated->ck.size());
  double worst = 0;
  for (std::size_t i = 0; i < own->ck.size(); ++i)
    worst = std::max({worst, static_cast<double>(std::abs(std::abs(own->ck[i]) - std::abs(calibrated->ck[i]))),
                      static_cast<double>(std::abs(std::abs(own->cv[i]) - std::abs(calibrated->cv[i])))});
  CHECK(worst < 2e-2);  // fp16 bases and coefficients
}

TEST_CASE("calibration bases from other requests replay differently; other geometries are refused", "[lowrank]") {
  SynthConfig cfg = test::small_synth_config(3);
  cfg.n_requests = 2;
  cfg.context_tokens = 96;
  const std::string trace = test::write_small_trace("lowrank_calib.h5", cfg);
  const TraceReader reader(trace);
  auto fitted = [&](int requests, const std::string& name) {
    const std::string path = test::scratch_file(name);
    save_basis_set(fit_calibration_bases({trace}, requests), path);
    return path;
  };
  const std::string own = fitted(1, "r0.basis"), other = fitted(2, "r0r1.basis");
  std::vector<ReplayConfig> cfgs;
  for (const std::string& spec :
       std::vector<std::string>{"lowrank", "lowrank:basis=" + other, "varrate:basis=" + other}) {
    PolicyInstance inst = PolicyRegistry::instance().create(spec);
    cfgs.push_back({inst.name, inst.params, std::shared_ptr<const Policy>(std::move(inst.policy)), 0.3});
  }
  const RequestResult res = Replayer(reader, ReplayMode::QueryAware, cfgs).replay("r0");
  CHECK(res.configs[1].mean_err != Approx(res.configs[0].mean_err).epsilon(1e-4));
  for (const auto& r : res.configs) {
    CHECK(r.compressed_bytes <= r.budget_bytes);
    CHECK(r.position_fallback == 0);
  }
  // Another model's geometry is refused, naming the field.
  BasisSet wrong = load_basis_set(own);
  wrong.n_layers += 1;
  wrong.heads.resize(wrong.heads.size() + static_cast<std::size_t>(wrong.n_kv_heads), wrong.heads.front());
  save_basis_set(wrong, own + ".wrong");
  PolicyInstance inst = PolicyRegistry::instance().create("lowrank:basis=" + own + ".wrong");
  const std::vector<ReplayConfig> bad{
      {inst.name, inst.params, std::shared_ptr<const Policy>(std::move(inst.policy)), 0.3}};
  CHECK_THROWS_WITH(Replayer(reader, ReplayMode::QueryAware, bad).replay("r0"), Catch::Contains("n_layers"));
}
