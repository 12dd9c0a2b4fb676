// The CPU side of the GPU parity harness: the kernels' references must themselves agree with the
// simulator's own code (intN storage = policies' int_roundtrip, packed rows = every codec's own
// reconstruction) and with attention's defining properties, so that a GPU matching them is right.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"
#include "gpu/packed_attention_ref.h"
#include "gpu/parity/nmse.h"
#include "gpu/transformer_kernels_ref.h"
#include "gpu/packed_rows.h"
#include "gpu/parity/random_inputs.h"
#include "gpu/parity/random_packed.h"
#include "gpu/transformer_shape.h"
#include "packed_fixtures.h"
#include "policies/codec.h"
#include "policies/lowrank.h"
#include "policies/quantize.h"
#include "policies/quantized_tier.h"
#include "policies/registry.h"

using namespace kvsim;
using namespace kvsim::gpu;
using namespace kvsim::test;

namespace {

// The device's run table of t gives back every row as t holds it (kind, rank and data; param for
// quantized rows; position where positions are kept); returns the number of runs.
std::size_t check_runs(const PackedTensor& t, int d) {
  const RowTable table = row_table(t, d);
  const PackedTensorView view = host_view(t, table);
  for (std::size_t m = 0; m < t.rows.size(); ++m) {
    INFO("row " << m << " of " << t.rows.size() << ", " << table.runs.size() << " runs");
    const PackedRow want = t.rows[m], got = packed_row_at(view, d, static_cast<std::int64_t>(m));
    REQUIRE(got.kind == want.kind);
    REQUIRE(got.rank == want.rank);
    REQUIRE(got.data == want.data);
    if (want.kind == PackedKind::Quant) REQUIRE(got.param == want.param);
    if (!table.positions.empty()) REQUIRE(got.position == want.position);
  }
  return table.runs.size();
}

}  // namespace

TEST_CASE("packed intN rows read back exactly what int_roundtrip reconstructs", "[gpu-ref]") {
  const int d = 64;
  const std::vector<float> rows = gaussian(static_cast<std::size_t>(20 * d), 3);
  for (const int bits : {2, 4, 8})
    for (const int group : {32, 64})
      for (const bool sym : {false, true}) {
        INFO(bits << " bits, group " << group << (sym ? " absmax" : " min-max"));
        const QuantSpec s{bits, group, sym};
        std::vector<std::uint8_t> codes(static_cast<std::size_t>(20 * s.row_bytes(d)));
        std::vector<std::uint16_t> params(static_cast<std::size_t>(20 * s.groups(d) * 2));
        pack_int_rows(s, d, rows.data(), 20, codes.data(), params.data());
        std::vector<float> back(rows.size());
        unpack_int_rows(s, d, codes.data(), params.data(), 20, back.data());
        std::vector<float> want = rows;
        for (int t = 0; t < 20; ++t)
          int_roundtrip(IntSpec{bits, group, sym}, std::span(want).subspan(static_cast<std::size_t>(t * d), d));
        CHECK(back == want);
        CHECK(s.row_bytes(d) + s.groups(d) * (sym ? 2.0 : 4.0) == int_row_bytes(IntSpec{bits, group, sym}, d));
      }
}

TEST_CASE("kept-index attention: one token gives its value, equal keys average, gathering = compacting", "[gpu-ref]") {
  const AttnShape s{4, 2, 8, 10};
  const std::vector<float> q = gaussian(4 * 8, 5), kf = gaussian(2 * 10 * 8, 6), vf = gaussian(2 * 10 * 8, 7);
  const auto k = halves(kf), v = halves(vf);
  std::vector<float> out(4 * 8), w(4 * 3);
  // One kept token per head: weight 1, output = its value row (as fp16 stores it).
  const std::vector<std::int32_t> one = {7, 0, 0, 2, 0, 0}, one_count = {1, 1};
  attend_kept_ref(s, q.data(), k.data(), v.data(), one.data(), one_count.data(), 3, out.data(), w.data());
  for (int h = 0; h < 4; ++h) {
    const int kv = h / 2, tok = kv == 0 ? 7 : 2;
    CHECK(w[static_cast<std::size_t>(h * 3)] == 1.0f);
    for (int x = 0; x < 8; ++x)
      CHECK(out[static_cast<std::size_t>(h * 8 + x)] ==
            half_to_float(v[static_cast<std::size_t>((kv * 10 + tok) * 8 + x)]));
  }
  // Gathering kept indices from the full cache = attending over a cache holding only them.
  const std::vector<std::int32_t> kept = {1, 4, 9, 0, 3, 5}, counts = {3, 3};
  attend_kept_ref(s, q.data(), k.data(), v.data(), kept.data(), counts.data(), 3, out.data(), w.data());
  std::vector<std::uint16_t> kc(2 * 3 * 8), vc(kc.size());
  for (int kv = 0; kv < 2; ++kv)
    for (int m = 0; m < 3; ++m)
      for (int x = 0; x < 8; ++x) {
        const auto src = static_cast<std::size_t>((kv * 10 + kept[static_cast<std::size_t>(kv * 3 + m)]) * 8 + x);
        kc[static_cast<std::size_t>((kv * 3 + m) * 8 + x)] = k[src];
        vc[static_cast<std::size_t>((kv * 3 + m) * 8 + x)] = v[src];
      }
  const std::vector<std::int32_t> dense = {0, 1, 2, 0, 1, 2};
  std::vector<float> out2(out.size()), w2(w.size());
  attend_kept_ref(AttnShape{4, 2, 8, 3}, q.data(), kc.data(), vc.data(), dense.data(), counts.data(), 3, out2.data(),
                  w2.data());
  CHECK(out2 == out);
  CHECK(w2 == w);
  double sum = 0;
  for (int m = 0; m < 3; ++m) sum += w[static_cast<std::size_t>(m)];
  CHECK(sum == Approx(1.0));
}

TEST_CASE("quantized attention equals kept-index attention over the dequantized rows", "[gpu-ref]") {
  const AttnShape s{6, 3, 32, 12};
  const QuantSpec spec{4, 32, false};
  const std::vector<float> q = gaussian(6 * 32, 8), kf = gaussian(3 * 12 * 32, 9), vf = gaussian(3 * 12 * 32, 10);
  std::vector<std::uint8_t> kc(static_cast<std::size_t>(3 * 12 * spec.row_bytes(32))), vc(kc.size());
  std::vector<std::uint16_t> kp(static_cast<std::size_t>(3 * 12 * 2)), vp(kp.size());
  pack_int_rows(spec, 32, kf.data(), 36, kc.data(), kp.data());
  pack_int_rows(spec, 32, vf.data(), 36, vc.data(), vp.data());
  const std::vector<std::int32_t> counts = {12, 12, 12};
  std::vector<float> out(6 * 32);
  attend_quant_ref(s, spec, q.data(), kc.data(), kp.data(), vc.data(), vp.data(), counts.data(), out.data());
  // The same attention computed directly on the dequantized floats.
  std::vector<float> kd(kf.size()), vd(vf.size());
  unpack_int_rows(spec, 32, kc.data(), kp.data(), 36, kd.data());
  unpack_int_rows(spec, 32, vc.data(), vp.data(), 36, vd.data());
  for (int h = 0; h < 6; ++h) {
    const int kv = h / 2;
    std::vector<double> w(12);
    double mx = -1e300, z = 0;
    for (int m = 0; m < 12; ++m) {
      double dot = 0;
      for (int x = 0; x < 32; ++x)
        dot += q[static_cast<std::size_t>(h * 32 + x)] * kd[static_cast<std::size_t>((kv * 12 + m) * 32 + x)];
      mx = std::max(mx, w[static_cast<std::size_t>(m)] = dot / std::sqrt(32.0));
    }
    for (auto& x : w) z += (x = std::exp(x - mx));
    for (int x = 0; x < 32; ++x) {
      double o = 0;
      for (int m = 0; m < 12; ++m)
        o += w[static_cast<std::size_t>(m)] / z * vd[static_cast<std::size_t>((kv * 12 + m) * 32 + x)];
      CHECK(out[static_cast<std::size_t>(h * 32 + x)] == Approx(o).margin(1e-6));
    }
  }
}

TEST_CASE("the device's run table reads back every packed row", "[gpu-ref]") {
  std::mt19937 rng(5);
  for (const bool rotate : {true, false}) {
    INFO("rotate " << rotate);
    // Kinds alternating row by row: a run a row, the table's worst case (16 B a row).
    const PackedTensor t = random_packed(32, 40, 4, 8, false, rotate, rng, 3, 6);
    const RowTable table = row_table(t, 32);
    CHECK(check_runs(t, 32) == t.rows.size());
    // Positions only where a low-rank row is rotated to one.
    CHECK(table.positions.size() == (rotate ? t.rows.size() : 0u));
    CHECK(table.bytes() == t.rows.size() * (rotate ? 20u : 16u));
  }
  const int d = 32;
  std::vector<float> x(d, 0.5f);
  {  // Rows appended out of order: the runs break where the offsets stop stepping by one row.
    PackedTensor t;
    for (int m = 0; m < 4; ++m) pack_fp16_row(t, x.data(), d, m);
    std::swap(t.rows[2], t.rows[3]);
    CHECK(check_runs(t, d) == 3);  // rows 0-1, row 2 (data 96), row 3 (data 64)
  }
  {  // KIVI-style keys (a pair per channel): a token group of one row, then a group of three
     // sharing their pairs. Row 1's pairs follow row 0's by one row's worth, so rows 0-1 read
     // as one run with their own pairs; rows 2-3 share row 1's and start a shared run.
    PackedTensor t;
    t.bits = 4, t.param_span = 1;
    t.codes.assign(4 * d / 2, 0x21);
    t.params.assign(2 * 2 * d, 0);
    for (int m = 0; m < 4; ++m) {
      PackedRow r;
      r.kind = PackedKind::Quant;
      r.data = m * d / 2;
      r.param = m == 0 ? 0 : d;
      t.rows.push_back(r);
    }
    CHECK(check_runs(t, d) == 2);
  }
  {  // Low rank: rank 0 rows (no coefficients: every row at one offset), then a stretch of rank 5.
    PackedTensor t;
    t.basis.assign(static_cast<std::size_t>(d * d), 0);
    t.basis_cols = d;
    for (int m = 0; m < 6; ++m) {
      PackedRow r;
      r.kind = PackedKind::LowRank;
      r.rank = m < 2 ? 0 : 5;
      r.data = static_cast<std::int64_t>(t.halves.size());
      t.halves.resize(t.halves.size() + r.rank);
      t.rows.push_back(r);
    }
    CHECK(check_runs(t, d) == 2);
  }
  {  // Symmetric per-token pairs (scales only): each row its own, one run.
    PackedTensor t;
    t.bits = 2, t.param_span = 16, t.symmetric = true;
    for (int m = 0; m < 5; ++m) {
      PackedRow r;
      r.kind = PackedKind::Quant;
      r.data = m * d * 2 / 8;
      r.param = m * (d / 16);
      t.rows.push_back(r);
    }
    t.codes.assign(5 * d * 2 / 8, 0);
    t.params.assign(2 * 5 * (d / 16), 0);
    CHECK(check_runs(t, d) == 1);
  }
  // Rotated keys with no low-rank row need no positions.
  PackedTensor quant_only = random_packed(d, 2, 4, 8, false, true, rng);
  quant_only.rows.erase(quant_only.rows.begin());  // drop the fp16 row 0; row 1 is quantized
  quant_only.rows.front().position = 9;
  CHECK(row_table(quant_only, d).positions.empty());
  // An offset past 32 bits cannot be held.
  PackedTensor huge = quant_only;
  huge.rows.front().data = std::int64_t{1} << 33;
  CHECK_THROWS_WITH(row_table(huge, d),
                    Catch::Contains("packed row 0: offsets 8589934592") && Catch::Contains("32-bit row table"));
}

TEST_CASE("the device's run table reads back every codec's packed output", "[gpu-ref]") {
  // What verify hands the device: each codec's packed entries, as plans from the codec tests
  // make them (tests/packed_fixtures.h). A codec's rows come in runs: the table is small.
  const ModelGeometry g = geometry(64);
  const PackedRows all = make_rows(g, 23);
  auto pack = [&](const KvCodec* codec, const HeadPlan& plan, const PackedRows& rows) {
    PackedEntry e;
    pack_plan(codec, plan, g, rows.pos, rows.k, rows.v, e);
    return e;
  };
  for (const int bits : {2, 4, 8})
    for (const bool symmetric : {false, true})
      for (const int group : {16, 32, 64}) {
        INFO("int" << bits << (symmetric ? " symmetric" : " asymmetric") << " group " << group);
        const IntCodec codec(IntSpec{bits, group, symmetric});
        const HeadPlan mixed = mixed_plan(23, int_codec(bits));
        const PackedEntry e = pack(&codec, mixed, kept_rows(all, mixed, g.head_dim));
        check_runs(e.k, g.head_dim);
        check_runs(e.v, g.head_dim);
        HeadPlan uniform;  // every token int-coded: one run a tensor, whatever the length
        uniform.codec.assign(23, int_codec(bits));
        const PackedEntry u = pack(&codec, uniform, all);
        CHECK(check_runs(u.k, g.head_dim) == 1);
        CHECK(check_runs(u.v, g.head_dim) == 1);
      }
  for (const char* spec : {"kivi:bits=2,group=16,residual=32", "kivi:bits=4,group=32,residual=0"}) {
    INFO(spec);
    const PolicyInstance p = PolicyRegistry::instance().create(spec);
    const PackedRows rows = make_rows(g, 101, 11);
    HeadPlan plan;
    plan.codec.assign(101, TokenCodec::Int2);
    const PackedEntry e = pack(p.policy->codec(), plan, rows);
    // Keys: one run per token group of quantized rows (they share their pairs), one for the fp16
    // rows after them; values: their per-token codes, then the fp16 rows (the residual window;
    // without one, values quantize whole and only the keys' partial group stays fp16).
    auto quantized = [](const PackedTensor& t) {
      return static_cast<std::size_t>(
          std::count_if(t.rows.begin(), t.rows.end(), [](const PackedRow& r) { return r.kind == PackedKind::Quant; }));
    };
    const std::size_t group = std::string(spec).find("group=16") != std::string::npos ? 16 : 32;
    REQUIRE(quantized(e.k) % group == 0);
    CHECK(check_runs(e.k, g.head_dim) == quantized(e.k) / group + (quantized(e.k) < 101 ? 1 : 0));
    CHECK(check_runs(e.v, g.head_dim) == 1 + (quantized(e.v) < 101 ? 1 : 0));
  }
  {  // Low rank: a run per stretch of one rank; a fixed rank is one run.
    const LowRankCodec codec;
    HeadPlan plan = mixed_plan(23, TokenCodec::LowRank);
    for (std::size_t j = 0; j < plan.codec.size(); ++j) plan.rank.push_back(static_cast<std::uint16_t>(j % 33));
    const PackedEntry e = pack(&codec, plan, kept_rows(all, plan, g.head_dim));
    check_runs(e.k, g.head_dim);
    check_runs(e.v, g.head_dim);
    HeadPlan fixed;
    fixed.codec.assign(23, TokenCodec::LowRank);
    fixed.rank.assign(23, 12);
    const PackedEntry f = pack(&codec, fixed, all);
    CHECK(check_runs(f.k, g.head_dim) == 1);
    CHECK(check_runs(f.v, g.head_dim) == 1);
  }
  {  // No codec: fp16 rows, one run.
    HeadPlan plan;
    plan.codec.assign(23, TokenCodec::Fp16);
    const PackedEntry e = pack(nullptr, plan, all);
    CHECK(check_runs(e.k, g.head_dim) == 1);
  }
}

TEST_CASE("the kernels' row decoding (packed_value, rotate_pair, half_round) is unpack_tensor's", "[gpu-ref]") {
  // The unpack kernel and the fused packed decode both rebuild rows through these functions; run
  // on the host over host copies of every kind of packed tensor, they must give unpack_tensor's rows.
  std::mt19937 rng(23);
  struct Case {
    int d, bits, span;
    bool symmetric, rotate;
    int param_group;
    RopeType pairing;
  };
  const Case cases[] = {{64, 4, 32, false, true, 1, RopeType::Norm},
                        {64, 2, 16, true, false, 1, RopeType::Norm},
                        {32, 8, 1, false, true, 6, RopeType::Neox},
                        {96, 4, 96, true, true, 1, RopeType::Neox},
                        {128, 8, 32, false, false, 1, RopeType::Neox}};
  for (const Case& c : cases) {
    INFO("d " << c.d << " bits " << c.bits << " span " << c.span << " symmetric " << c.symmetric << " rotate "
              << c.rotate);
    const PackedTensor t = random_packed(c.d, 45, c.bits, c.span, c.symmetric, c.rotate, rng, 7, c.param_group);
    const RopeSpec spec{c.pairing, c.d, c.d == 96 ? 64 : c.d, 10000.0};  // d 96: partial rotary
    std::vector<float> want;
    unpack_tensor(t, c.d, spec, want);
    std::vector<float> cos_t, sin_t;
    rope_tables(spec, 7 + 45, cos_t, sin_t);
    const RowTable table = row_table(t, c.d);
    const PackedTensorView view = host_view(t, table);
    const RopeShape rope{c.pairing == RopeType::Neox, spec.rope_dim};
    int rotated = 0;
    for (std::int64_t m = 0; m < view.n_rows; ++m) {
      INFO("row " << m);
      const PackedRow r = packed_row_at(view, c.d, m);
      std::vector<float> x(static_cast<std::size_t>(c.d));
      for (int i = 0; i < c.d; ++i) x[static_cast<std::size_t>(i)] = packed_value(view, r, i);
      if (packed_rotated(view, r)) {
        ++rotated;
        for (int i = 0; i < rope.rope_dim / 2; ++i)
          rotate_pair(rope, cos_t.data(), sin_t.data(), r.position, i, x.data());
      }
      for (int i = 0; i < c.d; ++i) {
        const float got = half_round(x[static_cast<std::size_t>(i)]);
        const float ref = want[static_cast<std::size_t>(m * c.d + i)];
        if (packed_rotated(view, r))  // the rotation's tables vs core/rope's: one fp16 step at most
          CHECK(std::abs(got - ref) <= std::ldexp(std::abs(ref), -10) + 1e-7f);
        else
          CHECK(got == ref);
      }
    }
    CHECK(rotated == (c.rotate ? 15 : 0));  // every third row is low rank
  }
}
