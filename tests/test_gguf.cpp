// The GGUF reader on small files built byte by byte: the happy path and each error it must name.
#include <catch2/catch.hpp>

#include <filesystem>

#include <cstring>
#include <string>
#include <vector>

#include "model/engine.h"
#include "model/gguf.h"
#include "core/error.h"
#include "core/half.h"
#include "gguf_fixtures.h"

using namespace kvsim;

namespace {

using Bytes = test::GgufBytes;

// One Q8_0 tensor of 2 rows x 32 and one F32 tensor of 4, plus a few metadata types.
Bytes valid_file(std::uint32_t q8_type = 8, std::uint64_t f32_offset = 96) {
  Bytes f;
  f.put<std::uint32_t>(0x46554747u).put<std::uint32_t>(3).put<std::uint64_t>(2).put<std::uint64_t>(4);
  f.str("general.architecture").put<std::uint32_t>(8).str("llama");
  f.str("llama.block_count").put<std::uint32_t>(4).put<std::uint32_t>(30);
  f.str("llama.rope.freq_base").put<std::uint32_t>(6).put<float>(100000.0f);
  f.str("tokenizer.ggml.tokens").put<std::uint32_t>(9).put<std::uint32_t>(8).put<std::uint64_t>(2).str("a").str("b");
  f.str("q")
      .put<std::uint32_t>(2)
      .put<std::uint64_t>(32)
      .put<std::uint64_t>(2)
      .put<std::uint32_t>(q8_type)
      .put<std::uint64_t>(0);
  f.str("n").put<std::uint32_t>(1).put<std::uint64_t>(4).put<std::uint32_t>(0).put<std::uint64_t>(f32_offset);
  f.pad(32);
  for (int r = 0; r < 2; ++r) {  // Q8_0 blocks: d = 0.5, q = j - 16 (row 0) / 16 - j (row 1)
    f.put<std::uint16_t>(float_to_half(0.5f));
    for (int j = 0; j < 32; ++j) f.put<std::int8_t>(static_cast<std::int8_t>(r == 0 ? j - 16 : 16 - j));
  }
  f.pad(32);
  for (float x : {1.5f, -2.0f, 0.25f, 8.0f}) f.put<float>(x);
  return f;
}

std::string write(const std::string& name, const std::vector<std::uint8_t>& bytes) {
  return test::write_scratch(name, bytes);
}

}  // namespace

TEST_CASE("a small GGUF file reads back: metadata, tensors, dequantized rows", "[gguf]") {
  const GgufFile f(write("ok.gguf", valid_file().b));
  CHECK(f.version() == 3);
  CHECK(f.get_string("general.architecture") == "llama");
  CHECK(f.get_int("llama.block_count") == 30);
  CHECK(f.get_float("llama.rope.freq_base") == 100000.0);
  CHECK(f.get_array("tokenizer.ggml.tokens").size() == 2);
  CHECK(f.get_int("llama.missing", 7) == 7);
  CHECK_THROWS_WITH(f.get_int("general.architecture"),
                    Catch::Contains("'general.architecture' is a string, expected an integer"));
  CHECK_THROWS_WITH(f.get_string("nope"), Catch::Contains("metadata 'nope' is missing"));
  const GgufTensor& q = f.tensor("q");
  CHECK(q.rows() == 2);
  std::vector<float> rows(64);
  f.dequantize_rows(q, 0, 2, rows);
  CHECK(rows[0] == -8.0f);  // 0.5 * (0 - 16)
  CHECK(rows[31] == 7.5f);  // 0.5 * 15
  CHECK(rows[32] == 8.0f);  // row 1: 0.5 * 16
  std::vector<float> n(4);
  f.dequantize_rows(f.tensor("n"), 0, 1, n);
  CHECK(n == std::vector<float>{1.5f, -2.0f, 0.25f, 8.0f});
  CHECK_THROWS_WITH(f.tensor("absent"), Catch::Contains("tensor 'absent' is missing"));
}

TEST_CASE("broken GGUF files are rejected with the reason", "[gguf]") {
  auto file = valid_file().b;
  SECTION("wrong magic") {
    file[0] = 'X';
    CHECK_THROWS_WITH(GgufFile(write("magic.gguf", file)), Catch::Contains("not a GGUF file"));
  }
  SECTION("unsupported version") {
    file[4] = 9;
    CHECK_THROWS_WITH(GgufFile(write("version.gguf", file)), Catch::Contains("GGUF version 9 is not supported"));
  }
  SECTION("truncated everywhere") {
    for (std::size_t cut : {3ul, 10ul, 30ul, 100ul, 200ul, file.size() - 1}) {
      std::vector<std::uint8_t> part(file.begin(), file.begin() + static_cast<std::ptrdiff_t>(cut));
      INFO("cut at " << cut);
      CHECK_THROWS_AS(GgufFile(write("cut.gguf", part)), FormatError);
    }
    CHECK_THROWS_WITH(GgufFile(write("cut.gguf", std::vector<std::uint8_t>(file.begin(), file.begin() + 30))),
                      Catch::Contains("truncated at byte"));
  }
  SECTION("unknown tensor type") {
    CHECK_THROWS_WITH(GgufFile(write("type.gguf", valid_file(77).b)),
                      Catch::Contains("tensor 'q' has ggml type 77, which this reader does not know"));
  }
  SECTION("tensor data beyond the end") {
    CHECK_THROWS_WITH(GgufFile(write("range.gguf", valid_file(8, 4096).b)),
                      Catch::Contains("tensor 'n' data") && Catch::Contains("beyond the end of the file"));
  }
  SECTION("misaligned tensor offset") {
    CHECK_THROWS_WITH(GgufFile(write("align.gguf", valid_file(8, 100).b)),
                      Catch::Contains("not a multiple of the alignment 32"));
  }
  SECTION("missing file") {
    CHECK_THROWS_WITH(GgufFile(test::scratch_file("none.gguf")), Catch::Contains("cannot open"));
  }
  // Found by fuzz_gguf: an array length was reserved before it was checked against the file, so a
  // 200-byte file could ask for 8 GB.
  SECTION("an array longer than the bytes left") {
    Bytes f;
    f.put<std::uint32_t>(0x46554747u).put<std::uint32_t>(3).put<std::uint64_t>(0).put<std::uint64_t>(1);
    f.str("tokenizer.ggml.tokens").put<std::uint32_t>(9).put<std::uint32_t>(8).put<std::uint64_t>(150'000'000).str("a");
    CHECK_THROWS_WITH(GgufFile(write("long_array.gguf", f.b)),
                      Catch::Contains("'tokenizer.ggml.tokens' claims 150000000 array elements with 9 bytes left"));
  }
  SECTION("a tensor whose element count overflows") {
    Bytes f;
    f.put<std::uint32_t>(0x46554747u).put<std::uint32_t>(3).put<std::uint64_t>(1).put<std::uint64_t>(0);
    f.str("w").put<std::uint32_t>(4);
    for (int d = 0; d < 4; ++d) f.put<std::uint64_t>(std::uint64_t{1} << 20);
    f.put<std::uint32_t>(0).put<std::uint64_t>(0);
    CHECK_THROWS_WITH(GgufFile(write("huge_tensor.gguf", f.b)),
                      Catch::Contains("tensor 'w' has more than 2^50 elements"));
  }
}

// Found by fuzz_gguf: a head count of 0 divided the embedding width by zero (undefined behaviour)
// before any check; a negative layer count would have sized a vector. Every dimension is now
// checked as it is read, naming its key.
TEST_CASE("model metadata out of range is refused naming the key", "[gguf]") {
  if (!std::filesystem::exists(KVSIM_TEST_MODEL))
    FAIL("SmolLM2 is missing: run scripts/setup.sh (" KVSIM_TEST_MODEL ")");
  const std::vector<std::pair<std::string, std::pair<std::uint32_t, std::string>>> cases = {
      {"llama.attention.head_count", {0, "llama.attention.head_count = 0, expected 1..16777216"}},
      {"llama.block_count", {0xFFFFFFFFu, "llama.block_count = 4294967295, expected 1..16777216"}},
      {"llama.rope.dimension_count", {63, "rope.dimension_count = 63, expected an even number <= the head size 64"}},
      {"llama.attention.head_count_kv", {4, "inconsistent head counts (9 heads, 4 KV heads)"}}};
  for (const auto& [key, expect] : cases) {
    INFO(key);
    const std::string path = test::patched_model(KVSIM_TEST_MODEL, {{key, expect.first}}, "bad_meta.gguf");
    const GgufFile f(path);
    CHECK_THROWS_WITH(model_config(f), Catch::Contains(expect.second));
  }
}
