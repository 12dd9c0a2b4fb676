// Weights kept quantized multiply like the same weights dequantized to f32: the block-dot GEMV
// (Q4_1, Q8_0), the unpacked one-byte GEMV (Q4_0, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, whose unpacking
// is checked bit for bit against the dequantizer) and the tiled GEMM, on a crafted GGUF.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "model/dequant.h"
#include "model/gguf.h"
#include "model/weight_matrix.h"
#include "core/error.h"
#include "core/half.h"
#include "gguf_fixtures.h"

using namespace kvsim;

namespace {

constexpr std::int64_t kRows = 300;  // not a multiple of any tile size
constexpr std::int64_t kCols = 256;  // one Q4_K super-block per row

struct TypeSpec {
  const char* name;
  std::uint32_t id;
  std::int64_t block, bytes;
};
const TypeSpec kTypes[] = {{"w_q4_1", 3, 32, 20},    {"w_q8_0", 8, 32, 34},   {"w_q4_k", 12, 256, 144},
                           {"w_q4_0", 2, 32, 18},    {"w_q5_0", 6, 32, 22},   {"w_q5_1", 7, 32, 24},
                           {"w_q5_k", 13, 256, 176}, {"w_q6_k", 14, 256, 210}};

// Random blocks whose f16 scales are small and finite (the rest of each block is any bytes).
std::vector<std::uint8_t> random_blocks(const TypeSpec& t, std::mt19937& rng) {
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.001f, 0.02f);
  std::vector<std::uint8_t> out;
  const std::int64_t blocks = kRows * kCols / t.block;
  for (std::int64_t b = 0; b < blocks; ++b) {
    std::vector<std::uint8_t> blk(static_cast<std::size_t>(t.bytes));
    for (auto& x : blk) x = static_cast<std::uint8_t>(byte(rng));
    auto put_half = [&](std::size_t at, float v) {
      const std::uint16_t h = float_to_half(v);
      blk[at] = static_cast<std::uint8_t>(h & 0xFF);
      blk[at + 1] = static_cast<std::uint8_t>(h >> 8);
    };
    if (t.id == 14) {  // Q6_K keeps its d last
      put_half(208, scale(rng));
    } else {
      put_half(0, scale(rng));
      if (t.id == 3 || t.id == 7 || t.id == 12 || t.id == 13)
        put_half(2, t.id == 3 || t.id == 7 ? -scale(rng) * 8 : scale(rng));  // Q4_1/Q5_1 m, Q4_K/Q5_K dmin
    }
    out.insert(out.end(), blk.begin(), blk.end());
  }
  return out;
}

std::string weights_file() {
  std::mt19937 rng(11);
  test::GgufBytes f;
  f.put<std::uint32_t>(0x46554747u).put<std::uint32_t>(3).put<std::uint64_t>(std::size(kTypes)).put<std::uint64_t>(0);
  std::vector<std::vector<std::uint8_t>> data;
  std::uint64_t offset = 0;
  for (const TypeSpec& t : kTypes) {
    data.push_back(random_blocks(t, rng));
    f.str(t.name)
        .put<std::uint32_t>(2)
        .put<std::uint64_t>(kCols)
        .put<std::uint64_t>(kRows)
        .put<std::uint32_t>(t.id)
        .put<std::uint64_t>(offset);
    offset += (data.back().size() + 31) / 32 * 32;
  }
  f.pad(32);
  for (const auto& d : data) {
    f.b.insert(f.b.end(), d.begin(), d.end());
    f.pad(32);
  }
  return test::write_scratch("weights.gguf", f.b);
}

}  // namespace

TEST_CASE("quantized weights multiply like their f32 dequantization", "[weights]") {
  const GgufFile f(weights_file());
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (const TypeSpec& t : kTypes) {
    const WeightMatrix exact(f, t.name, kRows, kCols, WeightFormat::F32);
    const WeightMatrix quant(f, t.name, kRows, kCols, WeightFormat::Quantized);
    CHECK(exact.heap_bytes() == kRows * kCols * sizeof(float));
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
    const bool unpacked = t.id != 3 && t.id != 8;  // 1 byte per weight + f32 scale and offset per 16
#else
    const bool unpacked = false;  // without the AVX2 GEMV nothing is unpacked
#endif
    CHECK(quant.heap_bytes() == (unpacked ? kRows * kCols * 3 / 2 : 0));
    std::vector<float> a(kCols), b(kCols);
    for (std::int64_t r : {0L, 17L, kRows - 1}) {
      exact.row(r, a.data());
      quant.row(r, b.data());
      CHECK(a == b);
    }
    // 1..4 rows take the GEMV path, more the tiled GEMM.
    for (std::int64_t n : {1, 3, 4, 5, 37}) {
      INFO(t.name << " with " << n << " input rows");
      std::vector<float> x(static_cast<std::size_t>(n * kCols));
      for (auto& v : x) v = normal(rng);
      std::vector<float> want(static_cast<std::size_t>(n * kRows)), got(want.size(), NAN);
      exact.multiply(x.data(), n, want.data());
      quant.multiply(x.data(), n, got.data());
      double worst = 0, scale = 0;
      for (std::size_t i = 0; i < want.size(); ++i) {
        worst = std::max(worst, std::abs(static_cast<double>(got[i]) - want[i]));
        scale = std::max(scale, std::abs(static_cast<double>(want[i])));
      }
      CHECK(scale > 0.1);
      CHECK(worst <= 1e-5 * scale);
    }
  }
}

TEST_CASE("a weight of the wrong shape or format is named", "[weights]") {
  const GgufFile f(weights_file());
  CHECK_THROWS_WITH(WeightMatrix(f, "w_q8_0", kRows, 128, WeightFormat::Quantized),
                    Catch::Contains("tensor 'w_q8_0' has shape [256, 300], expected [128, 300]"));
  CHECK_THROWS_WITH(parse_weight_format("int4"),
                    Catch::Contains("'int4' is not a weight format (expected f32 or quant)"));
}

TEST_CASE("unpacking to one byte per weight is exact: s*q + o equals the dequantizer bit for bit", "[weights]") {
  const GgufFile f(weights_file());
  for (const TypeSpec& t : kTypes) {
    const GgufTensor& tensor = f.tensor(t.name);
    if (!unpacks_to_u8(tensor.type)) continue;
    INFO(t.name);
    std::vector<float> want(kCols), s(kCols / 16), o(kCols / 16);
    std::vector<std::uint8_t> q(kCols);
    bool same = true;
    for (std::int64_t r = 0; r < kRows; ++r) {
      const std::uint8_t* row = tensor.data + r * (kCols / t.block * t.bytes);
      dequantize_row(tensor.type, row, want.data(), kCols);
      unpack_row_u8(tensor.type, row, kCols, q.data(), s.data(), o.data());
      for (std::int64_t i = 0; i < kCols; ++i) {
        volatile float scaled =
            s[static_cast<std::size_t>(i / 16)] * static_cast<float>(q[static_cast<std::size_t>(i)]);
        const float got = scaled + o[static_cast<std::size_t>(i / 16)];  // two roundings at most, as the dequantizer
        same = same && got == want[static_cast<std::size_t>(i)];
      }
    }
    CHECK(same);
  }
  CHECK_FALSE(unpacks_to_u8(GgmlType::Q8_0));
}
