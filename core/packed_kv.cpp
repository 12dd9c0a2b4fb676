#include "core/packed_kv.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "core/half.h"

namespace kvsim {

namespace {

double tensor_bytes(const PackedTensor& t) {
  const double pairs = static_cast<double>(t.params.size() / 2);
  return 2.0 * static_cast<double>(t.halves.size()) + static_cast<double>(t.codes.size()) +
         pairs * (t.symmetric ? 2.0 : 4.0) + 2.0 * static_cast<double>(t.basis.size()) * t.basis_charge;
}

void check_tensor(const PackedTensor& t, int d, const char* name) {
  auto fail = [&](std::size_t row, const std::string& what) {
    throw Error(std::string("packed ") + name + " row " + std::to_string(row) + ": " + what);
  };
  // The quantized layout only matters when some row is quantized.
  const bool quant =
      std::any_of(t.rows.begin(), t.rows.end(), [](const PackedRow& r) { return r.kind == PackedKind::Quant; });
  if (quant && t.bits != 2 && t.bits != 4 && t.bits != 8)
    throw Error(std::string("packed ") + name + ": bits = " + std::to_string(t.bits) + ", expected 2, 4 or 8");
  if (quant && (t.param_span <= 0 || d % t.param_span != 0))
    throw Error(std::string("packed ") + name + ": param_span = " + std::to_string(t.param_span) +
                " does not divide head_dim " + std::to_string(d));
  const auto code_bytes = (static_cast<std::int64_t>(d) * t.bits + 7) / 8;
  for (std::size_t m = 0; m < t.rows.size(); ++m) {
    const PackedRow& r = t.rows[m];
    switch (r.kind) {
      case PackedKind::Fp16:
        if (r.data < 0 || r.data + d > static_cast<std::int64_t>(t.halves.size())) fail(m, "fp16 row past the halves");
        break;
      case PackedKind::Quant:
        if (r.data < 0 || r.data + code_bytes > static_cast<std::int64_t>(t.codes.size()))
          fail(m, "codes past the end");
        if (r.param < 0 || 2 * (r.param + d / t.param_span) > static_cast<std::int64_t>(t.params.size()))
          fail(m, "params past the end");
        break;
      case PackedKind::LowRank:
        if (r.rank > d) fail(m, "rank " + std::to_string(r.rank) + " > head_dim " + std::to_string(d));
        if (r.data < 0 || r.data + r.rank > static_cast<std::int64_t>(t.halves.size()))
          fail(m, "coefficients past the halves");
        if (t.basis_cols < 1 || t.basis_cols > d ||
            t.basis.size() != static_cast<std::size_t>(d) * static_cast<std::size_t>(t.basis_cols))
          fail(m, "low-rank row without a [head_dim, basis_cols] basis (basis_cols = " + std::to_string(t.basis_cols) +
                      ", " + std::to_string(t.basis.size()) + " halves)");
        if (r.rank > t.basis_cols)
          fail(m, "rank " + std::to_string(r.rank) + " > basis_cols " + std::to_string(t.basis_cols));
        // The device reads its RoPE tables at this position.
        if (t.rotate && r.position < 0) fail(m, "position " + std::to_string(r.position) + ", expected >= 0");
        break;
      default:
        fail(m, "kind " + std::to_string(static_cast<int>(r.kind)) + ", expected 0 (fp16), 1 (quant) or 2 (low rank)");
    }
  }
}

}  // namespace

double PackedEntry::payload_bytes() const {
  std::int64_t low_rank = 0;
  int first_rank = -1;
  bool ranks_differ = false;
  for (const PackedRow& r : k.rows) {
    if (r.kind != PackedKind::LowRank) continue;
    ++low_rank;
    if (first_rank < 0) first_rank = r.rank;
    ranks_differ |= r.rank != first_rank;
  }
  return tensor_bytes(k) + tensor_bytes(v) + (ranks_differ ? static_cast<double>(low_rank) : 0.0);
}

void pack_fp16_row(PackedTensor& t, const float* x, int head_dim, std::int32_t position) {
  PackedRow r;
  r.kind = PackedKind::Fp16;
  r.position = position;
  r.data = static_cast<std::int64_t>(t.halves.size());
  for (int i = 0; i < head_dim; ++i) t.halves.push_back(float_to_half(x[i]));
  t.rows.push_back(r);
}

void check_packed(const PackedEntry& e) {
  if (e.head_dim <= 0) throw Error("packed entry: head_dim = " + std::to_string(e.head_dim) + ", expected > 0");
  if (e.k.rows.size() != e.v.rows.size())
    throw Error("packed entry: " + std::to_string(e.k.rows.size()) + " key rows but " +
                std::to_string(e.v.rows.size()) + " value rows");
  check_tensor(e.k, e.head_dim, "keys");
  check_tensor(e.v, e.head_dim, "values");
}

void unpack_tensor(const PackedTensor& t, int d, const RopeSpec& rope, std::vector<float>& out) {
  check_tensor(t, d, t.rotate ? "keys" : "values");
  out.assign(t.rows.size() * static_cast<std::size_t>(d), 0.0f);
  const int qmax = (1 << (t.bits - 1)) - 1;
  for (std::size_t m = 0; m < t.rows.size(); ++m) {
    const PackedRow& r = t.rows[m];
    float* x = out.data() + m * static_cast<std::size_t>(d);
    if (r.kind == PackedKind::Fp16) {
      for (int i = 0; i < d; ++i) x[i] = half_to_float(t.halves[static_cast<std::size_t>(r.data + i)]);
    } else if (r.kind == PackedKind::Quant) {
      const std::uint8_t* codes = t.codes.data() + r.data;
      for (int i = 0; i < d; ++i) {
        const int bit = i * t.bits;
        const unsigned u = (static_cast<unsigned>(codes[bit >> 3]) >> (bit & 7)) & ((1u << t.bits) - 1u);
        const auto pair = static_cast<std::size_t>(2 * (r.param + i / t.param_span));
        const float scale = half_to_float(t.params[pair]), mn = half_to_float(t.params[pair + 1]);
        x[i] = t.symmetric ? (static_cast<float>(u) - static_cast<float>(qmax)) * scale
                           : static_cast<float>(u) * scale + mn;
      }
    } else {
      for (int i = 0; i < d; ++i) {
        float s = 0;
        for (int c = 0; c < r.rank; ++c)
          s += half_to_float(t.basis[static_cast<std::size_t>(i * t.basis_cols + c)]) *
               half_to_float(t.halves[static_cast<std::size_t>(r.data + c)]);
        x[i] = s;
      }
      if (t.rotate) apply_rope(rope, x, 1, r.position);
    }
  }
  round_to_half(out.data(), out.size());  // the cache the attention reads is fp16
}

}  // namespace kvsim
