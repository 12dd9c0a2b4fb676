// The packed cache (core/packed_kv.h): what each codec stores reads back as its reconstruction
// rounded to fp16 (exactly for fp16 and intN / KIVI codes, to summation order for low rank), the
// stored payload is the codec's byte count, the bit layout matches a hand-packed byte, and a
// malformed entry is refused naming the row and field.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "core/packed_kv.h"
#include "policies/codec.h"
#include "policies/lowrank.h"
#include "policies/quantize.h"
#include "policies/quantized_tier.h"
#include "policies/registry.h"
#include "packed_fixtures.h"

using namespace kvsim;
using namespace kvsim::test;

namespace {

// Packs the plan's kept rows and checks the read-back against reconstruct (rounded to fp16):
// exactly (max_err 0) or to max_err; and the payload against the codec's byte count.
void check_pack(const KvCodec* codec, const HeadPlan& plan, const ModelGeometry& g, const PackedRows& kept,
                float max_err = 0) {
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
  for (std::size_t i = 0; i < ku.size(); ++i)
    worst = std::max({worst, std::abs(ku[i] - kh[i]), std::abs(vu[i] - vh[i])});
  CHECK(worst <= max_err);
  const double bytes = codec ? codec->bytes(plan, g.head_dim)
                             : static_cast<double>(plan.kept()) * codec_token_bytes(TokenCodec::Fp16, g.head_dim);
  CHECK(e.payload_bytes() == bytes);
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
  const ModelGeometry g = geometry(64);
  const PackedRows all = make_rows(g, 23);
  for (const int bits : {2, 4, 8})
    for (const bool symmetric : {false, true})
      for (const int group : {16, 32, 64, 128}) {
        INFO("int" << bits << (symmetric ? " symmetric" : " asymmetric") << " group " << group);
        const IntCodec codec(IntSpec{bits, group, symmetric});
        const HeadPlan plan = mixed_plan(23, int_codec(bits));
        check_pack(&codec, plan, g, kept_rows(all, plan, g.head_dim));
      }
}

TEST_CASE("packed KIVI: shared key pairs per token group, fp16 residual rows", "[packed]") {
  const ModelGeometry g = geometry(32);
  for (const char* spec :
       {"kivi:bits=2,group=16,residual=32", "kivi:bits=4,group=32,residual=64", "kivi:bits=8,group=16,residual=0"})
    for (const std::int64_t n : {std::int64_t{10}, std::int64_t{64}, std::int64_t{70}, std::int64_t{101}}) {
      INFO(spec << ", " << n << " tokens");
      const PolicyInstance p = PolicyRegistry::instance().create(spec);
      const PackedRows all = make_rows(g, n, 11);
      HeadPlan plan;
      plan.codec.assign(static_cast<std::size_t>(n), TokenCodec::Int2);
      check_pack(p.policy->codec(), plan, g, all);
    }
}

TEST_CASE("packed low rank: coefficients and bases rebuild the codec's rows, both RoPE pairings", "[packed]") {
  for (const RopeType type : {RopeType::Norm, RopeType::Neox}) {
    const ModelGeometry g = geometry(32, type);
    const PackedRows all = make_rows(g, 40, 3);
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
  const ModelGeometry g = geometry(16);
  const PackedRows all = make_rows(g, 9);
  HeadPlan plan = mixed_plan(9, TokenCodec::Fp16);
  check_pack(nullptr, plan, g, kept_rows(all, plan, g.head_dim));
  plan.codec[2] = TokenCodec::Int4;
  const PackedRows kept = kept_rows(all, plan, g.head_dim);
  PackedEntry e;
  CHECK_THROWS_WITH(pack_plan(nullptr, plan, g, kept.pos, kept.k, kept.v, e), Catch::Contains("has no codec"));
}

TEST_CASE("malformed packed entries are refused naming the row and field", "[packed]") {
  const ModelGeometry g = geometry(16);
  const PackedRows all = make_rows(g, 4);
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
    bad.k.basis_cols = 16;
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
  CHECK_THROWS_WITH(int_pack_row(IntSpec{2, 16, false}, std::span(all.k).first(16), 0, t),
                    Catch::Contains("one quantized layout"));
}

TEST_CASE("a codec without a packed form says so", "[packed]") {
  struct Opaque : KvCodec {
    double bytes(const HeadPlan&, int) const override { return 0; }
    void reconstruct(const HeadPlan&, const ModelGeometry&, std::span<const std::int32_t>, std::span<float>,
                     std::span<float>) const override {}
  } codec;
  const ModelGeometry g = geometry(16);
  const PackedRows all = make_rows(g, 2);
  HeadPlan plan;
  plan.codec.assign(2, TokenCodec::Int8);
  PackedEntry e;
  CHECK_THROWS_WITH(pack_plan(&codec, plan, g, all.pos, all.k, all.v, e), Catch::Contains("no packed (device) form"));
}
