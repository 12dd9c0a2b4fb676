// Low-rank storage: full rank reconstructs (to fp16 precision) through RoPE's inverse and back
// for both pairings, error falls with rank, bytes match a hand count, VarRate spends exactly its
// coefficient budget with every kept token at r_min or more.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "policies/lowrank.h"
#include "policies/registry.h"
#include "sim/replay.h"
#include "trace_fixtures.h"

using namespace kvsim;

namespace {

KvGeometry geometry(RopeType type) {
  KvGeometry g;
  g.n_layers = 1;
  g.n_q_heads = 2;
  g.n_kv_heads = 1;
  g.head_dim = 16;
  g.rope = RopeSpec{type, 16, 16, 10000.0};
  return g;
}

// Tokens whose pre-RoPE keys live mostly in a few directions (as real keys do), then rotated.
void make_tokens(const KvGeometry& g, std::int64_t n, std::vector<float>& k, std::vector<float>& v,
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
    const KvGeometry g = geometry(type);
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

TEST_CASE("low-rank bytes: coefficients, rank bytes, fp16 tokens and both bases", "[lowrank]") {
  HeadPlan plan;
  plan.codec = {TokenCodec::LowRank, TokenCodec::LowRank, TokenCodec::Drop, TokenCodec::Fp16};
  plan.rank = {2, 5, 0, 0};
  // d = 16: (4*2 + 1) + (4*5 + 1) + fp16 token 64 + bases 2 x 16 x 16 x 2 bytes.
  CHECK(lowrank_bytes(plan, 16) == 9 + 21 + 64 + 1024);
  plan.codec = {TokenCodec::Fp16, TokenCodec::Drop, TokenCodec::Drop, TokenCodec::Fp16};
  CHECK(lowrank_bytes(plan, 16) == 128);  // no low-rank token: no basis stored
}

TEST_CASE("varrate keeps every token at r_min or more and spends its coefficient budget", "[lowrank]") {
  SynthConfig cfg = test::small_synth_config(5);
  cfg.n_requests = 1;
  cfg.context_tokens = 200;
  cfg.generated_tokens = 4;
  const TraceReader reader(test::write_small_trace("varrate.h5", cfg));
  PolicyInstance var = PolicyRegistry::instance().create("varrate:r_min=2,window=8");
  PolicyInstance uni = PolicyRegistry::instance().create("lowrank");
  const std::vector<ReplayConfig> cfgs = {{var.name, var.params, std::shared_ptr<const Policy>(std::move(var.policy)), 0.6},
                                          {uni.name, uni.params, std::shared_ptr<const Policy>(std::move(uni.policy)), 0.6}};
  const RequestResult res = Replayer(reader, ReplayMode::QueryAware, cfgs).replay(reader.request_ids().front());
  for (const auto& r : res.configs) {
    CHECK(r.kept_fraction == 1.0);
    CHECK(r.compressed_bytes <= r.budget_bytes);
    CHECK(r.compressed_bytes > 0.9 * r.budget_bytes);
  }
}
