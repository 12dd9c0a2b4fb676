#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <random>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "trace_fixtures.h"
#include "traces/trace_check.h"
#include "traces/trace_reader.h"
#include "traces/trace_writer.h"

using namespace kvsim;

namespace {

ModelGeometry tiny_geometry() {
  ModelGeometry g;
  g.name = "tiny";
  g.n_layers = 3;
  g.n_q_heads = 4;
  g.n_kv_heads = 2;
  g.head_dim = 8;
  g.rope.rope_dim = g.rope.head_dim = 8;
  g.vocab = 50;
  g.sliding_window = {0, 16, 0};
  g.rope_theta_local = 10000.0;
  return g;
}

RequestHeader header(const std::string& id, int T, int Tq) {
  RequestHeader h;
  h.id = id;
  h.task = "unit";
  h.answer = "forty-two";
  for (int i = 0; i < T; ++i) {
    h.tokens.push_back(i % 50);
    h.positions.push_back(2 * i + 1);  // gaps are legal; only strict increase is required
    h.segments.push_back(static_cast<std::int8_t>(i < 2 ? 0 : i < T - 3 ? 1 : 2));
  }
  for (int i = T - Tq; i < T; ++i) h.q_index.push_back(i);
  h.n_prompt = T;
  h.question_start = T - 3;
  h.needle_start = 3;
  h.needle_end = 5;
  h.ref_rows = 2;
  h.ref_topk = 3;
  return h;
}

struct Layer {
  std::vector<std::uint16_t> k, v, q;
};

// Every 16-bit pattern shows up somewhere (NaN payloads and subnormals included): storage is raw.
std::vector<Layer> random_layers(const ModelGeometry& g, int T, int Tq, unsigned seed) {
  std::mt19937 gen(seed);
  std::vector<Layer> out(static_cast<std::size_t>(g.n_layers));
  for (auto& l : out) {
    l.k.resize(static_cast<std::size_t>(T * g.n_kv_heads * g.head_dim));
    l.v.resize(l.k.size());
    l.q.resize(static_cast<std::size_t>(Tq * g.n_q_heads * g.head_dim));
    for (auto* vec : {&l.k, &l.v, &l.q})
      for (auto& x : *vec) x = static_cast<std::uint16_t>(gen());
  }
  return out;
}

ReferenceDistribution reference() {
  ReferenceDistribution r;
  r.rows = 2;
  r.topk = 3;
  r.index = {7, 9};
  r.topk_ids = {1, 2, 3, 4, 5, 6};
  r.topk_logp = {-0.1f, -2.5f, -3.0f, -0.7f, -1.0f, -9.5f};
  r.lse = {3.5f, 4.25f};
  return r;
}

}  // namespace

TEST_CASE("a trace round-trips bit-exactly, uncompressed and compressed", "[trace]") {
  const int deflate = GENERATE(0, 4);
  const ModelGeometry g = tiny_geometry();
  const std::string path = test::scratch_file("roundtrip" + std::to_string(deflate) + ".h5");
  CaptureInfo cap;
  cap.backend = "unit";
  cap.seed = 99;
  cap.config = R"({"x":1})";
  const auto layers_a = random_layers(g, 10, 4, 1);
  const auto layers_b = random_layers(g, 6, 6, 2);
  {
    TraceWriterOptions opts;
    opts.overwrite = true;
    opts.deflate_level = deflate;
    TraceWriter w(path, g, cap, opts);
    for (auto [id, T, Tq, layers] :
         {std::tuple{"b-second", 10, 4, &layers_a}, std::tuple{"a-first", 6, 6, &layers_b}}) {
      w.begin_request(header(id, T, Tq));
      for (int l = 0; l < g.n_layers; ++l) {
        const Layer& x = (*layers)[static_cast<std::size_t>(l)];
        w.write_layer(l, x.k, x.v, x.q);
      }
      auto ref = reference();
      if (T == 6) ref.index = {3, 5};
      w.write_reference(ref);
      w.commit_request();
    }
    CHECK(w.requests_written() == 2);
  }
  TraceReader r(path);
  CHECK(r.geometry() == g);
  CHECK(r.capture().backend == "unit");
  CHECK(r.capture().seed == 99);
  CHECK(r.capture().config == R"({"x":1})");
  // Write order, not name order.
  REQUIRE(r.request_ids() == std::vector<std::string>{"b-second", "a-first"});
  CHECK(r.incomplete_request_ids().empty());

  const RequestHeader h = r.header("b-second");
  const RequestHeader expect = header("b-second", 10, 4);
  CHECK(h.tokens == expect.tokens);
  CHECK(h.positions == expect.positions);
  CHECK(h.segments == expect.segments);
  CHECK(h.q_index == expect.q_index);
  CHECK(h.task == "unit");
  CHECK(h.answer == "forty-two");
  CHECK(h.question_start == 7);
  CHECK(h.needle_start == 3);
  CHECK(h.needle_end == 5);
  CHECK(h.ref_rows == 2);
  CHECK(h.ref_topk == 3);
  const ReferenceDistribution ref = r.reference("b-second");
  CHECK(ref.topk_ids == reference().topk_ids);
  CHECK(ref.topk_logp == reference().topk_logp);
  CHECK(ref.lse == reference().lse);
  CHECK(ref.index == reference().index);

  // Random access: alternate between requests and layers out of order.
  for (int l : {2, 0, 1}) {
    for (const auto& [id, layers] : {std::pair{"a-first", &layers_b}, std::pair{"b-second", &layers_a}}) {
      const Layer& x = (*layers)[static_cast<std::size_t>(l)];
      std::vector<std::uint16_t> k(r.layer_elements(id, Tensor::K)), v(k.size()), q(r.layer_elements(id, Tensor::Q));
      r.read_layer_half(id, Tensor::K, l, k);
      r.read_layer_half(id, Tensor::V, l, v);
      r.read_layer_half(id, Tensor::Q, l, q);
      CHECK(k == x.k);
      CHECK(v == x.v);
      CHECK(q == x.q);
      std::vector<float> kf(k.size()), expect_f(k.size());
      r.read_layer(id, Tensor::K, l, kf);
      halves_to_floats_scalar(x.k.data(), expect_f.data(), x.k.size());
      CHECK(std::memcmp(kf.data(), expect_f.data(), kf.size() * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("the writer rejects misuse with messages naming what was expected", "[trace]") {
  const ModelGeometry g = tiny_geometry();
  const std::string path = test::scratch_file("misuse.h5");
  TraceWriterOptions opts;
  opts.overwrite = true;
  TraceWriter w(path, g, {}, opts);
  RequestHeader bad = header("r", 10, 4);
  bad.positions[4] = bad.positions[3];
  CHECK_THROWS_WITH(w.begin_request(bad), Catch::Contains("positions[4]") && Catch::Contains("strictly increasing"));
  bad = header("r", 10, 4);
  bad.segments[2] = 9;
  CHECK_THROWS_WITH(w.begin_request(bad), Catch::Contains("segments[2] = 9") && Catch::Contains("expected 0..3"));
  bad = header("r/x", 10, 4);
  CHECK_THROWS_WITH(w.begin_request(bad), Catch::Contains("not usable as an HDF5 name"));
  bad = header("r", 10, 4);
  bad.tokens[0] = 50;
  CHECK_THROWS_WITH(w.begin_request(bad), Catch::Contains("tokens[0] = 50") && Catch::Contains("vocab = 50"));

  w.begin_request(header("ok", 10, 4));
  const auto layers = random_layers(g, 10, 4, 3);
  CHECK_THROWS_WITH(w.write_layer(1, layers[1].k, layers[1].v, layers[1].q), Catch::Contains("expected layer 0"));
  CHECK_THROWS_WITH(w.write_layer(0, layers[0].q, layers[0].v, layers[0].q), Catch::Contains("expected k=v=160"));
  w.write_layer(0, layers[0].k, layers[0].v, layers[0].q);
  CHECK_THROWS_WITH(w.commit_request(), Catch::Contains("after 1 layers, expected all 3"));
  CHECK_THROWS_WITH(w.begin_request(header("other", 10, 4)), Catch::Contains("still open"));
  for (int l = 1; l < 3; ++l)
    w.write_layer(l, layers[static_cast<std::size_t>(l)].k, layers[static_cast<std::size_t>(l)].v,
                  layers[static_cast<std::size_t>(l)].q);
  CHECK_THROWS_WITH(w.commit_request(), Catch::Contains("write_reference was not called"));
  w.write_reference(reference());
  w.commit_request();
  CHECK_THROWS_WITH(w.begin_request(header("ok", 10, 4)), Catch::Contains("used twice"));
}

TEST_CASE("the writer never overwrites an existing file unless asked", "[trace]") {
  const std::string path = test::scratch_file("keep.h5");
  { TraceWriter w(path, tiny_geometry(), {}, TraceWriterOptions{true, 0}); }
  const auto size = std::filesystem::file_size(path);
  CHECK_THROWS_WITH(TraceWriter(path, tiny_geometry(), {}), Catch::Contains("refusing to overwrite"));
  CHECK(std::filesystem::file_size(path) == size);
}

TEST_CASE("synthetic layers read back as the f32 values rounded to half", "[trace]") {
  const SynthConfig cfg = test::small_synth_config();
  const std::string path = test::write_small_trace("synth_roundtrip.h5", cfg);
  TraceReader r(path);
  REQUIRE(r.request_ids().size() == 3);
  const SynthPlan plan = plan_synth_request(cfg, 1);
  const SynthLayer layer = synth_layer(cfg, plan, 1, 2);
  std::vector<float> q(r.layer_elements("r1", Tensor::Q));
  r.read_layer("r1", Tensor::Q, 2, q);
  REQUIRE(q.size() == layer.q.size());
  for (std::size_t i = 0; i < q.size(); ++i) REQUIRE(q[i] == half_to_float(float_to_half(layer.q[i])));
  CHECK(r.header("r1").tokens == plan.header.tokens);
}

TEST_CASE("the reconstruction pass round-trips and bad tables are refused", "[trace]") {
  const ModelGeometry g = tiny_geometry();
  const std::string path = test::scratch_file("reconstruction.h5");
  TraceWriterOptions opts;
  opts.overwrite = true;
  // Context = tokens [2, 7) of 10 (question at 7); two chunks of the pass: [2, 5) in rows [0, 4)
  // and [5, 7) in rows [4, 7).
  RepeatPass pass;
  pass.chunks = {{2, 5, 0, 4}, {5, 7, 4, 7}};
  pass.rows = 7;
  for (int l = 0; l < g.n_layers; ++l) {
    std::vector<float> q(static_cast<std::size_t>(7 * g.n_q_heads * g.head_dim)),
        k(static_cast<std::size_t>(7 * g.n_kv_heads * g.head_dim));
    for (std::size_t i = 0; i < q.size(); ++i) q[i] = 0.25f * static_cast<float>(i % 13) - static_cast<float>(l);
    for (std::size_t i = 0; i < k.size(); ++i) k[i] = 0.5f * static_cast<float>(i % 7) + static_cast<float>(l);
    pass.q.push_back(q);
    pass.k.push_back(k);
  }
  {
    TraceWriter w(path, g, {}, opts);
    const auto layers = random_layers(g, 10, 4, 5);
    for (const std::string id : {"with", "without"}) {
      w.begin_request(header(id, 10, 4));
      for (int l = 0; l < 3; ++l)
        w.write_layer(l, layers[static_cast<std::size_t>(l)].k, layers[static_cast<std::size_t>(l)].v,
                      layers[static_cast<std::size_t>(l)].q);
      w.write_reference(reference());
      if (std::string(id) == "with") {
        RepeatPass bad = pass;
        bad.chunks[1].end = 8;  // past the question's start
        CHECK_THROWS_WITH(w.write_repeat_pass(bad), Catch::Contains("context tokens before the question"));
        bad = pass;
        bad.q.pop_back();
        CHECK_THROWS_WITH(w.write_repeat_pass(bad), Catch::Contains("expected 3"));
        w.write_repeat_pass(pass);
      }
      w.commit_request();
    }
  }
  const TraceReader r(path);
  CHECK(r.has_repeat_pass("with"));
  CHECK_FALSE(r.has_repeat_pass("without"));
  CHECK_THROWS_WITH(r.repeat_pass_table("without"), Catch::Contains("--repeat-pass"));
  const RepeatPass table = r.repeat_pass_table("with");
  REQUIRE(table.chunks.size() == 2);
  CHECK(table.chunks[1].begin == 5);
  CHECK(table.chunks[1].row_end == 7);
  CHECK(table.rows == 7);
  std::vector<float> q, k;
  for (int l = 0; l < g.n_layers; ++l) {
    r.read_repeat_layer("with", l, q, k);
    CHECK(q == pass.q[static_cast<std::size_t>(l)]);  // the values are exact in half precision
    CHECK(k == pass.k[static_cast<std::size_t>(l)]);
  }
  // The random layers hold NaN patterns the checker reports; the pass itself must pass.
  for (const auto& e : check_trace(path).errors) CHECK(e.find("repeat pass") == std::string::npos);
}
