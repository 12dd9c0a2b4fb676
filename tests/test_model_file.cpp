// learned/model_file.h: learned-policy model files round-trip, and what does not fit is refused.
#include <catch2/catch.hpp>
#include <cmath>

#include "core/sha256.h"
#include "learned/features.h"
#include "learned/model_file.h"
#include "trace_fixtures.h"

using namespace kvsim;
using namespace kvsim::learned;

namespace {

LearnedModel small_model(const ModelGeometry& g) {
  LearnedModel m;
  m.method = "foresight";
  m.feature_set = kFeatureSet;
  m.feature_version = kFeatureVersion;
  m.features = feature_names();
  m.geometry = g;
  m.network = Mlp({kFeatureCount, 4, 1}, Activation::Relu, 3);
  m.norm_mean.assign(kFeatureCount, 0.5);
  m.norm_std.assign(kFeatureCount, 2.0);
  m.head_gates.assign(static_cast<std::size_t>(g.n_layers * g.n_kv_heads), 0.25);
  m.curve = {"loss", {1, 2, 3}, {0.9, 0.5, 0.4}};
  m.provenance.traces = {{"a.h5", sha256_hex("a")}};
  m.provenance.requests = {{0, "r0", 123456789012345ull}, {0, "r1", 42}};
  m.provenance.seed = 99;
  m.provenance.hyperparameters = R"({"steps":3})";
  m.provenance.created = "2026-12-06T00:00:00Z";
  m.results = R"({"golden_overlap_25":0.5})";
  return m;
}

}  // namespace

TEST_CASE("sha256 of the FIPS 180-4 examples", "[model_file]") {
  CHECK(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(sha256_hex(std::string(1000000, 'a')) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("a model file round-trips every field", "[model_file]") {
  const ModelGeometry g = test::small_synth_config().geometry;
  const LearnedModel m = small_model(g);
  const std::string path = test::scratch_file("model_roundtrip.h5");
  write_learned_model(m, path);
  const LearnedModel r = read_learned_model(path);
  CHECK(r.method == m.method);
  CHECK(r.features == m.features);
  CHECK(r.network.sizes() == m.network.sizes());
  CHECK(r.network.activation() == Activation::Relu);
  CHECK(r.network.params() == m.network.params());
  CHECK(r.norm_mean == m.norm_mean);
  CHECK(r.norm_std == m.norm_std);
  CHECK(r.head_gates == m.head_gates);
  CHECK(r.curve.metric == "loss");
  CHECK(r.curve.value == m.curve.value);
  CHECK(r.provenance.traces == m.provenance.traces);
  REQUIRE(r.provenance.requests.size() == 2);
  CHECK(r.provenance.requests[0].prompt == 123456789012345ull);
  CHECK(r.provenance.requests[1].id == "r1");
  CHECK(r.provenance.seed == 99);
  CHECK(r.provenance.hyperparameters == m.provenance.hyperparameters);
  CHECK(r.results == m.results);
  CHECK(training_prompts(r) == std::vector<std::uint64_t>{123456789012345ull, 42});
  CHECK_NOTHROW(check_learned_model(r, path, "foresight", g));
}

TEST_CASE("a model that does not fit the run is refused naming the file and field", "[model_file]") {
  const ModelGeometry g = test::small_synth_config().geometry;
  LearnedModel m = small_model(g);
  const std::string path = test::scratch_file("model_refusals.h5");
  write_learned_model(m, path);
  const LearnedModel r = read_learned_model(path);
  CHECK_THROWS_WITH(check_learned_model(r, path, "rlkv", g),
                    Catch::Contains(path) && Catch::Contains("'method'") && Catch::Contains("kvsim train rlkv"));
  ModelGeometry other = g;
  other.n_layers = 30;
  CHECK_THROWS_WITH(check_learned_model(r, path, "foresight", other),
                    Catch::Contains("/geometry") && Catch::Contains("4 layers") && Catch::Contains("30 layers"));
  LearnedModel old = r;
  old.feature_version = kFeatureVersion + 1;
  CHECK_THROWS_WITH(check_learned_model(old, path, "foresight", g), Catch::Contains("'feature_version'"));
  LearnedModel bare = r;
  bare.network = Mlp();
  CHECK_THROWS_WITH(check_learned_model(bare, path, "foresight", g), Catch::Contains("group '/network' is missing"));

  CHECK_THROWS_WITH(read_learned_model(test::scratch_file("no_such_model.h5")), Catch::Contains("not found"));
  const std::string trace = test::write_small_trace("not_a_model.h5");
  CHECK_THROWS_WITH(read_learned_model(trace), Catch::Contains("not a kvsim learned-policy model"));
  m.head_gates.assign(5, 1.0);
  write_learned_model(m, path);
  CHECK_THROWS_WITH(read_learned_model(path),
                    Catch::Contains("'head_gates'") && Catch::Contains("4 layers x 2 KV heads"));
  m = small_model(g);
  m.head_gates[2] = std::nan("");
  write_learned_model(m, path);
  CHECK_THROWS_WITH(read_learned_model(path),
                    Catch::Contains("head_gates") && Catch::Contains("value 2 is not finite"));
  m = small_model(g);
  m.norm_std[3] = 0;
  write_learned_model(m, path);
  CHECK_THROWS_WITH(read_learned_model(path), Catch::Contains("norm_std") && Catch::Contains("positive"));
}
