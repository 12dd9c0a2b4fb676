// Chunk states in traces and their deviation curves (prompts/chunk_alone.h, traces' chunk_states
// group, sim/chunk_deviation.h): a capture with --chunk-states records each chunk computed alone;
// the first chunk alone is its own state; layer 0 does not depend on the context; a chunk after
// two different paths gives other-path pairs; bad tables and missing records are refused.
#include <catch2/catch.hpp>

#include "capture/capture_driver.h"
#include "capture/chunked_tasks.h"
#include "core/error.h"
#include "gguf_fixtures.h"
#include "sim/chunk_deviation.h"
#include "traces/trace_reader.h"
#include "traces/trace_writer.h"

using namespace kvsim;

namespace {

std::vector<CaptureRequest> requests() {
  // Two requests sharing chunk "b" after different paths: (a, b) and (c, b); a third holds another
  // text under the id "b", which is no state of it.
  CaptureRequest x, y, z;
  x.id = "x", y.id = "y", z.id = "z";
  x.question = y.question = z.question = "What is the code of Birch?";
  x.chunks = {{"a", "Notes on the harbour and its boats.\n\n"}, {"b", "The code of Birch is 4417. It opens late.\n\n"}};
  y.chunks = {{"c", "A list of fruit: apples, pears, plums, figs.\n\n"}, x.chunks[1]};
  z.chunks = {{"c", y.chunks[0].text}, {"b", "Another text entirely, under the same id.\n\n"}};
  for (CaptureRequest* r : {&x, &y, &z})
    for (const RequestChunk& c : r->chunks) r->context += c.text;
  return {x, y, z};
}

std::string captured(bool states) {
  CaptureOptions o;
  o.model_path = test::patched_model(KVSIM_TEST_MODEL, {{"llama.block_count", 4}}, "smollm2_4l_dev.gguf");
  o.out_path = test::scratch_file(states ? "chunk_states.h5" : "no_chunk_states.h5");
  o.overwrite = true;
  o.max_new = 4;
  o.chunk_states = states;
  run_capture(requests(), o);
  return o.out_path;
}

}  // namespace

TEST_CASE("a capture records chunks alone; the curves compare them with the chunks in context", "[chunks]") {
  const TraceReader reader(captured(true));
  REQUIRE(reader.has_chunk_states("x"));
  const ChunkStateRecord t = reader.chunk_state_table("x");
  REQUIRE(t.chunks.size() == 2);
  CHECK(t.chunks[1].id == "b");
  CHECK(t.chunks[0].row_begin == 0);
  CHECK(t.rows == t.chunks[1].row_end);
  // The first chunk alone is its own state: the rows in context, exactly.
  std::vector<float> ak, av, k(reader.layer_elements("x", Tensor::K));
  reader.read_chunk_state_layer("x", 2, ak, av);
  reader.read_layer("x", Tensor::K, 2, k);
  const auto row = static_cast<std::size_t>(reader.geometry().n_kv_heads * reader.geometry().head_dim);
  const auto n0 = static_cast<std::size_t>(t.chunks[0].end - t.chunks[0].begin);
  CHECK(std::vector<float>(ak.begin(), ak.begin() + static_cast<std::ptrdiff_t>(n0 * row)) ==
        std::vector<float>(
            k.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(t.chunks[0].begin) * row),
            k.begin() + static_cast<std::ptrdiff_t>((static_cast<std::size_t>(t.chunks[0].begin) + n0) * row)));

  const std::vector<DeviationCurve> curves = chunk_deviation(reader);
  REQUIRE(curves.size() == 8);  // alone and other_path, 4 layers
  const DeviationCurve &alone0 = curves[0], &other0 = curves[1], &alone3 = curves[6], &other3 = curves[7];
  CHECK(alone0.comparison == "alone");
  CHECK(other0.comparison == "other_path");
  const ChunkStateRecord tz = reader.chunk_state_table("z");
  CHECK(alone0.deviation.size() ==
        static_cast<std::size_t>(2 * (t.chunks[1].end - t.chunks[1].begin) + tz.chunks[1].end - tz.chunks[1].begin));
  CHECK(other0.deviation.size() == static_cast<std::size_t>(t.chunks[1].end - t.chunks[1].begin));
  CHECK(alone0.quantile(1.0) < 0.01);  // layer 0: only the rotation's rounding
  CHECK(other0.quantile(1.0) < 0.01);
  CHECK(alone3.quantile(0.5) > alone0.quantile(0.5));
  CHECK(other3.share_above(0.01) > 0);
  CHECK(alone0.share_above(1.0) == 0);

  const TraceReader without(captured(false));
  CHECK_FALSE(without.has_chunk_states("x"));
  CHECK_THROWS_WITH(chunk_deviation(without), Catch::Contains("capture chunked requests with --chunk-states"));
  CHECK_THROWS_WITH(without.chunk_state_table("x"), Catch::Contains("chunk states are missing"));
}

TEST_CASE("chunk states: unchunked requests refused by capture, bad tables by the writer", "[chunks]") {
  CaptureOptions o;
  o.model_path = test::patched_model(KVSIM_TEST_MODEL, {{"llama.block_count", 4}}, "smollm2_4l_dev.gguf");
  o.out_path = test::scratch_file("unchunked_states.h5");
  o.overwrite = true;
  o.max_new = 2;
  o.chunk_states = true;
  CaptureRequest plain;
  plain.id = "p";
  plain.context = "Some context.";
  plain.question = "Q?";
  CHECK_THROWS_WITH(run_capture({plain}, o), Catch::Contains("--chunk-states needs chunked requests"));

  const TraceReader reader(captured(true));
  TraceWriterOptions wo;
  wo.overwrite = true;
  TraceWriter w(test::scratch_file("bad_states.h5"), reader.geometry(), reader.capture(), wo);
  RequestHeader h = reader.header("x");
  w.begin_request(h);
  ChunkStateRecord bad;
  bad.chunks = {{"a", 5, 9, 0, 3}};  // 4 tokens, 3 rows
  bad.rows = 3;
  CHECK_THROWS_WITH(w.write_chunk_states(bad), Catch::Contains("expected consecutive rows, one per token"));
  // Ids twice: written (the writer checks rows), refused when read.
  ChunkStateRecord twice = reader.chunk_state_table("x");
  reader.read_chunk_state_layer("x", 0, twice.k.emplace_back(), twice.v.emplace_back());
  for (int l = 1; l < reader.geometry().n_layers; ++l)
    reader.read_chunk_state_layer("x", l, twice.k.emplace_back(), twice.v.emplace_back());
  twice.chunks[1].id = twice.chunks[0].id;
  w.write_chunk_states(twice);
  for (int l = 0; l < reader.geometry().n_layers; ++l) {  // the request's own layers, copied
    std::vector<std::uint16_t> k(reader.layer_elements("x", Tensor::K)), v(k.size()),
        q(reader.layer_elements("x", Tensor::Q));
    reader.read_layer_half("x", Tensor::K, l, k);
    reader.read_layer_half("x", Tensor::V, l, v);
    reader.read_layer_half("x", Tensor::Q, l, q);
    w.write_layer(l, k, v, q);
  }
  w.write_reference(reader.reference("x"));
  w.commit_request();
  w.close();
  const TraceReader back(test::scratch_file("bad_states.h5"));
  CHECK_THROWS_WITH(back.chunk_state_table("x"), Catch::Contains("chunk id 'a' appears twice"));
}
