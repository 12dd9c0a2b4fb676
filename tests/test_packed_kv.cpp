// The packed cache (core/packed_kv.h): what each codec stores reads back as its reconstruction
// rounded to fp16 (exactly for fp16 and intN / KIVI codes, to summation order for low rank), the
// stored payload is the codec's byte count, the bit layout matches a hand-packed byte, and a
// malformed entry is refused naming the row and field.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "core/packed_kv.h"
#include "gpu/packed_rows.h"
#include "policies/codec.h"
#include "policies/lowrank.h"
#include "policies/quantize.h"
#include "policies/quantized_tier.h"
#include "policies/registry.h"

using namespace kvsim;

namespace {

KvGeometry geometry(int d, RopeType type = RopeType::Norm) {
  KvGeometry g;
  g.n_layers = 1;
  g.n_q_heads = 2;
  g.n_kv_heads = 1;
  g.head_dim = d;
  g.rope = RopeSpec{type, d, d, 10000.0};
  return g;
}

// n rows of fp16 values with an outlier channel (as real keys have) and positions 3, 5, 7, ...
struct Rows {
  std::vector<float> k, v;
  std::vector<std::int32_t> pos;
};
Rows make_rows(const KvGeometry& g, std::int64_t n, unsigned seed = 5) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  Rows r;
  const int d = g.head_dim;
  for (std::int64_t j = 0; j < n; ++j) {
    r.pos.push_back(static_cast<std::int32_t>(3 + 2 * j));
    for (int i = 0; i < d; ++i) {
      r.k.push_back(nd(rng) * (i == 3 ? 12.0f : 4.0f / static_cast<float>(1 + i % 8)));
      r.v.push_back(nd(rng));
    }
  }
  round_to_half(r.k.data(), r.k.size());
  round_to_half(r.v.data(), r.v.size());
  return r;
}

// The kept tokens' rows in cached order, as the engines hand them to a codec.
Rows kept_rows(const Rows& all, const HeadPlan& plan, int d) {
  Rows r;
  for (std::size_t j = 0; j < plan.codec.size(); ++j) {
    if (plan.codec[j] == TokenCodec::Drop) continue;
    r.k.insert(r.k.end(), all.k.begin() + static_cast<std::ptrdiff_t>(j * d), all.k.begin() + static_cast<std::ptrdiff_t>((j + 1) * d));
    r.v.insert(r.v.end(), all.v.begin() + static_cast<std::ptrdiff_t>(j * d), all.v.begin() + static_cast<std::ptrdiff_t>((j + 1) * d));
    r.pos.push_back(all.pos[j]);
  }
  return r;
}

// The device's run table of t (gpu/packed_rows.h) gives back every row; returns its run count.
std::size_t check_runs(const PackedTensor& t, int d) {
  const gpu::RowTable table = gpu::row_table(t, d);
  const gpu::PackedTensorView view = gpu::host_view(t, table);
  for (std::size_t m = 0; m < t.rows.size(); ++m) {
    INFO("row " << m << " of " << t.rows.size() << ", " << table.runs.size() << " runs");
    const PackedRow want = t.rows[m], got = gpu::packed_row_at(view, d, static_cast<std::int64_t>(m));
    REQUIRE(got.kind == want.kind);
    REQUIRE(got.rank == want.rank);
    REQUIRE(got.data == want.data);
    if (want.kind == PackedKind::Quant) REQUIRE(got.param == want.param);
    if (want.kind == PackedKind::LowRank && t.rotate) REQUIRE(got.position == want.position);
  }
  return table.runs.size();
}

struct Runs {
  std::size_t k = 0, v = 0;
};

// Packs the plan's kept rows and checks the read-back against reconstruct (rounded to fp16):
// exactly (max_err 0) or to max_err; the payload against the codec's byte count; and the
// device's run table against every row. Returns the run counts.
Runs check_pack(const KvCodec* codec, const HeadPlan& plan, const KvGeometry& g, const Rows& kept, float max_err = 0) {
  PackedEntry e;
  pack_plan(codec, plan, g, kept.pos, kept.k, kept.v, e);
  REQUIRE(e.rows() == plan.kept());
  auto kh = kept.k, vh = kept.v;
  if (codec) codec->reconstruct(plan, g, kept.pos, kh, vh);
  round_to_half(kh.data(), kh.size());
  round_to_half(vh.data(), vh.size());
  std::vector<float> ku, vu;
  unpack_tensor(e.k, g.head_dim, g.rope, ku);
  unpack_tensor(e.v, g.head_dim, g.rope, vu);
  REQUIRE(ku.size() == kh.size());
  REQUIRE(vu.size() == vh.size());
  float worst = 0;
  for (std::size_t i = 0; i < ku.size(); ++i) worst = std::max({worst, std::abs(ku[i] - kh[i]), std::abs(vu[i] - vh[i])});
  CHECK(worst <= max_err);
  const double bytes = codec ? codec->bytes(plan, g.head_dim)
                             : static_cast<double>(plan.kept()) * codec_token_bytes(TokenCodec::Fp16, g.head_dim);
  CHECK(e.payload_bytes() == bytes);
  return {check_runs(e.k, g.head_dim), check_runs(e.v, g.head_dim)};
}

HeadPlan mixed_plan(std::int64_t n, TokenCodec encoded) {
  HeadPlan p;
  for (std::int64_t j = 0; j < n; ++j)
    p.codec.push_back(j % 5 == 1 ? TokenCodec::Drop : j % 3 == 0 ? TokenCodec::Fp16 : encoded);
  return p;
}

}  // namespace

TEST_CASE("packed codes: a hand-packed int2 byte and its fp16 pair", "[packed]") {
  PackedTensor t;
  const std::vector<float> row = {0, 1, 2, 3};  // min 0, scale (3 - 0) / 3 = 1: codes 0 1 2 3
  int_pack_row(IntSpec{2, 4, false}, row, 7, t);
  REQUIRE(t.codes.size() == 1);
  CHECK(t.codes[0] == 0xE4);  // 0b11'10'01'00: value i at bits 2i
  REQUIRE(t.params.size() == 2);
  CHECK(half_to_float(t.params[0]) == 1.0f);
  CHECK(half_to_float(t.params[1]) == 0.0f);
  CHECK(t.rows.at(0).position == 7);
  std::vector<float> out;
  unpack_tensor(t, 4, RopeSpec{}, out);
  CHECK(out == row);
}

TEST_CASE("packed intN reads back as its reconstruction, bytes as counted", "[packed]") {
  const KvGeometry g = geometry(64);
  const Rows all = make_rows(g, 23);
  for (const int bits : {2, 4, 8})
    for (const bool symmetric : {false, true})
      for (const int group : {16, 32, 64, 128}) {
        INFO("int" << bits << (symmetric ? " symmetric" : " asymmetric") << " group " << group);
        const IntCodec codec(IntSpec{bits, group, symmetric});
        const HeadPlan plan = mixed_plan(23, int_codec(bits));
        check_pack(&codec, plan, g, kept_rows(all, plan, g.head_dim));
        // Every token int-coded: one run a tensor on the device, whatever the length.
        HeadPlan uniform;
        uniform.codec.assign(23, int_codec(bits));
        const Runs runs = check_pack(&codec, uniform, g, all);
        CHECK(runs.k == 1);
        CHECK(runs.v == 1);
      }
}

TEST_CASE("packed KIVI: shared key pairs per token group, fp16 residual rows", "[packed]") {
  const KvGeometry g = geometry(32);
  for (const char* spec : {"kivi:bits=2,group=16,residual=32", "kivi:bits=4,group=32,residual=64", "kivi:bits=8,group=16,residual=0"})
    for (const std::int64_t n : {std::int64_t{10}, std::int64_t{64}, std::int64_t{70}, std::int64_t{101}}) {
      INFO(spec << ", " << n << " tokens");
      const PolicyInstance p = PolicyRegistry::instance().create(spec);
      const Rows all = make_rows(g, n, 11);
      HeadPlan plan;
      plan.codec.assign(static_cast<std::size_t>(n), TokenCodec::Int2);
      const Runs runs = check_pack(p.policy->codec(), plan, g, all);
      // Keys: a run per token group (its rows share their pairs) and one for the fp16 residual;
      // values: the per-token codes, then the residual.
      const int group = std::string(spec).find("group=32") != std::string::npos ? 32 : 16;
      CHECK(runs.k <= static_cast<std::size_t>(n / group + 1));
      CHECK(runs.v <= 2u);
    }
}

TEST_CASE("packed low rank: coefficients and bases rebuild the codec's rows, both RoPE pairings", "[packed]") {
  for (const RopeType type : {RopeType::Norm, RopeType::Neox}) {
    const KvGeometry g = geometry(32, type);
    const Rows all = make_rows(g, 40, 3);
    HeadPlan plan = mixed_plan(40, TokenCodec::LowRank);
    for (std::size_t j = 0; j < plan.codec.size(); ++j) plan.rank.push_back(static_cast<std::uint16_t>(j % 33));
    const LowRankCodec codec;
    INFO((type == RopeType::Neox ? "neox" : "norm"));
    // A fit on the kept tokens (no plan data) and the policy's fit on every cached token.
    check_pack(&codec, plan, g, kept_rows(all, plan, g.head_dim), 0.02f);
    plan.data = fit_lowrank(g, all.k, all.v, all.pos);
    check_pack(&codec, plan, g, kept_rows(all, plan, g.head_dim), 0.02f);
  }
}

TEST_CASE("packed fp16-only plans need no codec", "[packed]") {
  const KvGeometry g = geometry(16);
  const Rows all = make_rows(g, 9);
  HeadPlan plan = mixed_plan(9, TokenCodec::Fp16);
  check_pack(nullptr, plan, g, kept_rows(all, plan, g.head_dim));
  plan.codec[2] = TokenCodec::Int4;
  const Rows kept = kept_rows(all, plan, g.head_dim);
  PackedEntry e;
  CHECK_THROWS_WITH(pack_plan(nullptr, plan, g, kept.pos, kept.k, kept.v, e), Catch::Contains("has no codec"));
}

TEST_CASE("malformed packed entries are refused naming the row and field", "[packed]") {
  const KvGeometry g = geometry(16);
  const Rows all = make_rows(g, 4);
  const IntCodec codec(IntSpec{4, 16, false});
  HeadPlan plan;
  plan.codec.assign(4, TokenCodec::Int4);
  PackedEntry e;
  pack_plan(&codec, plan, g, all.pos, all.k, all.v, e);
  std::vector<float> out;
  {
    PackedEntry bad = e;
    bad.k.codes.resize(bad.k.codes.size() - 1);
    CHECK_THROWS_WITH(check_packed(bad), Catch::Contains("packed keys row 3: codes past the end"));
    CHECK_THROWS_WITH(unpack_tensor(bad.k, 16, g.rope, out), Catch::Contains("codes past the end"));
  }
  {
    PackedEntry bad = e;
    bad.v.rows[1].param = 1000;
    CHECK_THROWS_WITH(check_packed(bad), Catch::Contains("packed values row 1: params past the end"));
  }
  {
    PackedEntry bad = e;
    bad.v.bits = 3;
    CHECK_THROWS_WITH(check_packed(bad), Catch::Contains("bits = 3, expected 2, 4 or 8"));
  }
  {
    PackedEntry bad = e;
    bad.k.rows[0].kind = static_cast<PackedKind>(9);
    CHECK_THROWS_WITH(check_packed(bad), Catch::Contains("kind 9, expected 0 (fp16), 1 (quant) or 2 (low rank)"));
  }
  {
    PackedEntry bad = e;
    bad.v.rows.pop_back();
    CHECK_THROWS_WITH(check_packed(bad), Catch::Contains("4 key rows but 3 value rows"));
  }
  {
    PackedEntry bad = e;
    bad.k.rows[2].kind = PackedKind::LowRank;
    bad.k.rows[2].rank = 17;
    CHECK_THROWS_WITH(check_packed(bad), Catch::Contains("rank 17 > head_dim 16"));
  }
  {
    PackedEntry bad = e;
    bad.k.basis.assign(16 * 16, 0);
    bad.k.rows[2].kind = PackedKind::LowRank;
    bad.k.rows[2].rank = 1;
    bad.k.rows[2].data = 0;
    bad.k.halves.assign(1, 0);
    bad.k.rows[2].position = -5;
    bad.k.rotate = true;  // keys rebuilt pre-RoPE are rotated to their position
    CHECK_THROWS_WITH(check_packed(bad), Catch::Contains("packed keys row 2: position -5, expected >= 0"));
    bad.k.rotate = false;  // unrotated rows (values) never read a position
    CHECK_NOTHROW(check_packed(bad));
  }
  CHECK_THROWS_WITH(pack_plan(&codec, plan, g, std::span(all.pos).first(3), all.k, all.v, e),
                    Catch::Contains("keeping 4 tokens got 3 positions"));
  // A quantized layout of a second kind cannot join a tensor holding one.
  PackedTensor t;
  int_pack_row(IntSpec{4, 16, false}, std::span(all.k).first(16), 0, t);
  CHECK_THROWS_WITH(int_pack_row(IntSpec{2, 16, false}, std::span(all.k).first(16), 0, t), Catch::Contains("one quantized layout"));
}

TEST_CASE("a codec without a packed form says so", "[packed]") {
  struct Opaque : KvCodec {
    double bytes(const HeadPlan&, int) const override { return 0; }
    void reconstruct(const HeadPlan&, const KvGeometry&, std::span<const std::int32_t>, std::span<float>,
                     std::span<float>) const override {}
  } codec;
  const KvGeometry g = geometry(16);
  const Rows all = make_rows(g, 2);
  HeadPlan plan;
  plan.codec.assign(2, TokenCodec::Int8);
  PackedEntry e;
  CHECK_THROWS_WITH(pack_plan(&codec, plan, g, all.pos, all.k, all.v, e), Catch::Contains("no packed (device) form"));
}
