// A writer killed midway (SIGKILL: no destructors, no flush) must leave every committed request
// readable and bit-exact, and the request in flight detectably incomplete.
#include <catch2/catch.hpp>

#include <chrono>
#include <set>
#include <csignal>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

#include "core/half.h"
#include "trace_fixtures.h"
#include "traces/trace_check.h"
#include "traces/trace_reader.h"

using namespace kvsim;

namespace {

enum class KillAt { AfterBegin, MidLayers, AfterLayers, AfterReference };

// Child process: commits `committed` requests, then dies at `at` inside the next one.
[[noreturn]] void write_then_die(const std::string& path, const SynthConfig& cfg, int committed, KillAt at) {
  TraceWriter w(path, cfg.geometry, synth_capture_info(cfg), TraceWriterOptions{true, 0});
  for (int r = 0; r <= committed; ++r) {
    const SynthPlan plan = plan_synth_request(cfg, r);
    w.begin_request(plan.header);
    if (r == committed && at == KillAt::AfterBegin) ::raise(SIGKILL);
    for (int l = 0; l < cfg.geometry.n_layers; ++l) {
      if (r == committed && at == KillAt::MidLayers && l == cfg.geometry.n_layers / 2) ::raise(SIGKILL);
      const SynthLayer layer = synth_layer(cfg, plan, r, l);
      w.write_layer_f32(l, layer.k, layer.v, layer.q);
    }
    if (r == committed && at == KillAt::AfterLayers) ::raise(SIGKILL);
    w.write_reference(synth_reference(cfg, plan, r));
    if (r == committed && at == KillAt::AfterReference) ::raise(SIGKILL);
    w.commit_request();
  }
  ::_exit(3);  // unreachable: the loop always dies inside the last request
}

// Every committed request must hold exactly what the generator produced.
void verify_committed(const std::string& path, const SynthConfig& cfg, std::size_t expect_complete) {
  TraceReader reader(path);
  REQUIRE(reader.request_ids().size() == expect_complete);
  REQUIRE(reader.incomplete_request_ids().size() <= 1);
  for (std::size_t r = 0; r < expect_complete; ++r) {
    const std::string& id = reader.request_ids()[r];
    REQUIRE(id == "r" + std::to_string(r));
    const SynthPlan plan = plan_synth_request(cfg, static_cast<int>(r));
    CHECK(reader.header(id).tokens == plan.header.tokens);
    for (int l = 0; l < cfg.geometry.n_layers; ++l) {
      const SynthLayer layer = synth_layer(cfg, plan, static_cast<int>(r), l);
      std::vector<std::uint16_t> expect(layer.v.size()), got(layer.v.size());
      floats_to_halves(layer.v.data(), expect.data(), expect.size());
      reader.read_layer_half(id, Tensor::V, l, got);
      REQUIRE(got == expect);
    }
    CHECK(reader.reference(id).lse == synth_reference(cfg, plan, static_cast<int>(r)).lse);
  }
}

}  // namespace

TEST_CASE("a writer killed at any point inside a request loses only that request", "[recovery]") {
  const KillAt at = GENERATE(KillAt::AfterBegin, KillAt::MidLayers, KillAt::AfterLayers, KillAt::AfterReference);
  const SynthConfig cfg = test::small_synth_config();
  const std::string path = test::scratch_file("killed" + std::to_string(static_cast<int>(at)) + ".h5");
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) write_then_die(path, cfg, 2, at);
  int status = 0;
  ::waitpid(pid, &status, 0);
  REQUIRE(WIFSIGNALED(status));
  REQUIRE(WTERMSIG(status) == SIGKILL);

  verify_committed(path, cfg, 2);
  REQUIRE(TraceReader(path).incomplete_request_ids() == std::vector<std::string>{"r2"});
  const TraceCheckReport report = check_trace(path);
  REQUIRE(report.errors.size() == 1);
  CHECK_THAT(report.errors[0], Catch::Contains("request 'r2' is incomplete"));

  // Appending (capture --resume): the two committed requests stay, the torn r2 is written again,
  // and the file then holds what one uninterrupted writer writes.
  {
    TraceWriterOptions append;
    append.append = true;
    TraceWriter w(path, cfg.geometry, synth_capture_info(cfg), append);
    CHECK(w.written_ids() == std::set<std::string>{"r0", "r1"});
    const SynthPlan plan = plan_synth_request(cfg, 2);
    w.begin_request(plan.header);
    for (int l = 0; l < cfg.geometry.n_layers; ++l) {
      const SynthLayer layer = synth_layer(cfg, plan, 2, l);
      w.write_layer_f32(l, layer.k, layer.v, layer.q);
    }
    w.write_reference(synth_reference(cfg, plan, 2));
    w.commit_request();
    w.close();
  }
  verify_committed(path, cfg, 3);
  CHECK(check_trace(path).ok());
}

TEST_CASE("appending to a trace of another model or capture configuration is refused", "[recovery]") {
  const SynthConfig cfg = test::small_synth_config();
  const std::string path = test::write_small_trace("append_refused.h5");
  TraceWriterOptions append;
  append.append = true;
  CaptureInfo other = synth_capture_info(cfg);
  other.config = "{\"tool\":\"something else\"}";
  CHECK_THROWS_WITH(TraceWriter(path, cfg.geometry, other, append),
                    Catch::Contains("--resume with a different capture configuration"));
  ModelGeometry g = cfg.geometry;
  g.n_layers += 1;
  CHECK_THROWS_WITH(TraceWriter(path, g, synth_capture_info(cfg), append), Catch::Contains("another model geometry"));
  CHECK(TraceReader(path).request_ids().size() == 3);  // untouched
}

TEST_CASE("a writer killed from outside at an arbitrary moment leaves a readable file", "[recovery]") {
  SynthConfig cfg = test::small_synth_config();
  cfg.n_requests = 1000000;  // the child writes until it is killed
  cfg.context_tokens = 400;
  const int delay_ms = GENERATE(150, 400, 700);
  const std::string path = test::scratch_file("shot" + std::to_string(delay_ms) + ".h5");
  // The delay counts from the moment the file exists: on a loaded machine the child may take
  // longer than the delay just to start, and a kill before the file is created tests nothing.
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(ready[0]);
    TraceWriter w(path, cfg.geometry, synth_capture_info(cfg), TraceWriterOptions{true, 0});
    const char byte = 1;
    if (::write(ready[1], &byte, 1) != 1) ::_exit(4);
    write_synth_trace(cfg, w);
    ::_exit(0);
  }
  ::close(ready[1]);
  char byte = 0;
  REQUIRE(::read(ready[0], &byte, 1) == 1);
  ::close(ready[0]);
  std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  REQUIRE(WIFSIGNALED(status));
  TraceReader reader(path);
  INFO("killed after " << delay_ms << " ms with " << reader.request_ids().size() << " committed");
  verify_committed(path, cfg, reader.request_ids().size());
}
