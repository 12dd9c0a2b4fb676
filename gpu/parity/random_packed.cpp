#include "gpu/parity/random_packed.h"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/half.h"
#include "gpu/parity/random_inputs.h"

namespace kvsim::gpu {

PackedTensor random_packed(int d, std::int64_t n, int bits, int span, bool symmetric, bool rotate, std::mt19937& rng,
                           std::int32_t first_position, int param_group) {
  PackedTensor t;
  t.bits = bits, t.param_span = span, t.symmetric = symmetric, t.rotate = rotate;
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.01f, 0.2f), mn(-1.0f, 0.0f);
  // A basis narrower than head_dim (a request's own basis stores only the directions its ranks
  // use), so the decoding's column stride is exercised.
  t.basis_cols = std::max(1, d - d / 4);
  t.basis = halves(gaussian(static_cast<std::size_t>(d) * static_cast<std::size_t>(t.basis_cols), rng, 0.125f));
  std::int64_t run_group = -1, run_start = 0;
  for (std::int64_t m = 0; m < n; ++m) {
    PackedRow r;
    r.position = first_position + static_cast<std::int32_t>(m);
    if (m % 3 == 0) {
      std::vector<float> x(static_cast<std::size_t>(d));
      std::normal_distribution<float> nd;
      for (auto& v : x) v = nd(rng);
      pack_fp16_row(t, x.data(), d, r.position);
      continue;
    }
    if (m % 3 == 1) {
      r.kind = PackedKind::Quant;
      r.data = static_cast<std::int64_t>(t.codes.size());
      for (int b = 0; b < d * bits / 8; ++b) t.codes.push_back(static_cast<std::uint8_t>(byte(rng)));
      // A new run of pairs for each group of rows; the rows of a group read the same run.
      if (m / param_group != run_group) {
        run_group = m / param_group;
        run_start = static_cast<std::int64_t>(t.params.size() / 2);
        for (int g = 0; g < d / span; ++g) {
          t.params.push_back(float_to_half(scale(rng)));
          t.params.push_back(float_to_half(symmetric ? 0.0f : mn(rng)));
        }
      }
      r.param = run_start;
    } else {
      r.kind = PackedKind::LowRank;
      r.rank = static_cast<std::uint16_t>(1 + m % t.basis_cols);
      r.data = static_cast<std::int64_t>(t.halves.size());
      const auto c = halves(gaussian(r.rank, rng));
      t.halves.insert(t.halves.end(), c.begin(), c.end());
    }
    t.rows.push_back(r);
  }
  return t;
}

std::vector<HostEntry> PackedLayer::entries() const {
  std::vector<HostEntry> out;
  for (std::size_t e = 0; e < packs.size(); ++e) {
    const auto d = static_cast<std::int64_t>(packs[e].head_dim);
    out.push_back(
        {static_cast<std::int64_t>(k[e].size()) / d, k[e].data(), v[e].data(), is_packed[e] ? &packs[e] : nullptr});
  }
  return out;
}

PackedLayer random_packed_layer(const ModelConfig& s, int layer, std::int64_t rows,
                                const std::function<std::vector<float>(int, bool)>& rows_of, std::mt19937& rng) {
  const int d = s.head_dim, entries = s.n_kv_heads;
  const bool all_packed = layer % 2 == 1;
  PackedLayer out;
  out.packs.resize(static_cast<std::size_t>(entries));
  out.is_packed.assign(static_cast<std::size_t>(entries), 0);
  for (int e = 0; e < entries; ++e) {
    const auto ue = static_cast<std::size_t>(e);
    std::int64_t prefix = all_packed ? rows : std::max<std::int64_t>(rows - 3 - e, 0);
    if (!all_packed && entries > 1 && e == entries - 1) prefix = 0;
    PackedEntry& p = out.packs[ue];
    p.head_dim = d;
    if (prefix > 0) {
      out.is_packed[ue] = 1;
      if (all_packed) {
        p.k = random_packed(d, prefix, 8, 1, false, true, rng, 0, 6);
        p.v = random_packed(d, prefix, 4, d, true, false, rng);
      } else {
        p.k = random_packed(d, prefix, 4, std::min(32, d), false, true, rng);
        p.v = random_packed(d, prefix, 2, std::min(16, d), true, false, rng);
      }
    }
    for (const bool keys : {true, false}) {
      std::vector<float>& dst = keys ? out.k.emplace_back() : out.v.emplace_back();
      dst.assign(static_cast<std::size_t>(prefix * d), std::numeric_limits<float>::quiet_NaN());
      const std::vector<float> now = rows_of(e, keys);
      if (static_cast<std::int64_t>(now.size()) != rows * d)
        throw std::invalid_argument("random_packed_layer: entry " + std::to_string(e) + " has " +
                                    std::to_string(now.size() / static_cast<std::size_t>(d)) + " rows, expected " +
                                    std::to_string(rows));
      dst.insert(dst.end(), now.begin() + prefix * d, now.end());
    }
  }
  return out;
}

MixedPackedCache random_mixed_cache(int entries, int d, std::int64_t n, RopeType pairing, std::mt19937& rng) {
  MixedPackedCache c;
  const RopeSpec spec{pairing, d, d, 10000.0};
  std::vector<std::int64_t> prefix(static_cast<std::size_t>(entries));
  for (int e = 0; e < entries; ++e) {
    auto& p = prefix[static_cast<std::size_t>(e)];
    p = e == 0 ? n : (e == entries - 1 ? 0 : std::max<std::int64_t>(n - 37 - 5 * e, 0));
    c.tail = std::max(c.tail, n - p);
  }
  const auto ud = static_cast<std::size_t>(d), un = static_cast<std::size_t>(n), ut = static_cast<std::size_t>(c.tail);
  c.dense_k.resize(static_cast<std::size_t>(entries) * un * ud);
  c.dense_v.resize(c.dense_k.size());
  c.tail_k.resize(static_cast<std::size_t>(entries) * ut * ud);
  c.tail_v.resize(c.tail_k.size());
  c.keys.resize(static_cast<std::size_t>(entries));
  c.values.resize(static_cast<std::size_t>(entries));
  for (int e = 0; e < entries; ++e) {
    const auto ue = static_cast<std::size_t>(e);
    const std::int64_t p = prefix[ue];
    for (const bool is_key : {true, false}) {
      auto& dense = is_key ? c.dense_k : c.dense_v;
      auto& tails = is_key ? c.tail_k : c.tail_v;
      if (p > 0) {
        PackedTensor& t = is_key ? c.keys[ue] : c.values[ue];
        t = is_key ? random_packed(d, p, 4, std::min(32, d), false, true, rng)
                   : random_packed(d, p, 2, std::min(16, d), true, false, rng);
        std::vector<float> read_back;
        unpack_tensor(t, d, spec, read_back);
        floats_to_halves(read_back.data(), dense.data() + ue * un * ud, read_back.size());
      }
      const std::vector<float> x = gaussian(static_cast<std::size_t>(n - p) * ud, rng);
      floats_to_halves(x.data(), dense.data() + (ue * un + static_cast<std::size_t>(p)) * ud, x.size());
      floats_to_halves(x.data(), tails.data() + ue * ut * ud, x.size());
    }
  }
  return c;
}

}  // namespace kvsim::gpu
