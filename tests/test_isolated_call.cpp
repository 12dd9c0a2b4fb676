#include <catch2/catch.hpp>

#include <csignal>
#include <stdexcept>

#include "core/isolated_call.h"

using namespace kvsim;

TEST_CASE("run_isolated returns the child's result, its exception, or its crash", "[isolated]") {
  const auto ok = run_isolated([] { return std::string(100000, 'x') + "end"; });  // larger than a pipe buffer
  CHECK(ok.status == IsolatedResult::Status::Ok);
  CHECK(ok.output.size() == 100003);
  CHECK(ok.output.substr(100000) == "end");

  const auto threw = run_isolated([]() -> std::string { throw std::runtime_error("bad field 'x'"); });
  CHECK(threw.status == IsolatedResult::Status::Threw);
  CHECK(threw.output == "bad field 'x'");

  const auto crashed = run_isolated([]() -> std::string {
    std::raise(SIGSEGV);
    return "unreachable";
  });
  CHECK(crashed.status == IsolatedResult::Status::Crashed);
  CHECK(crashed.signal == SIGSEGV);
}
