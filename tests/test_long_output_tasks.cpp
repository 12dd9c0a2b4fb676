// capture/long_output_tasks: requests whose answers run to hundreds of tokens.
#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "capture/long_output_tasks.h"
#include "core/error.h"
#include "trace_fixtures.h"

using namespace kvsim;

namespace {

std::vector<std::string> expected_of(const CaptureRequest& q) {
  return nlohmann::json::parse(q.expected).get<std::vector<std::string>>();
}

}  // namespace

TEST_CASE("recall tasks list every record in the context, in order, reproducibly", "[tasks]") {
  LongOutputSpec spec;
  spec.kind = LongOutputKind::Recall;
  spec.count = 2;
  spec.items = 24;
  spec.approx_tokens = 800;
  const auto a = make_long_output_tasks(spec), b = make_long_output_tasks(spec);
  REQUIRE(a.size() == 2);
  for (const CaptureRequest& q : a) {
    INFO(q.id);
    CHECK(q.task == "long_recall:contains_all");
    const auto want = expected_of(q);
    REQUIRE(want.size() == 48);  // per record: who ships where, and the code
    std::size_t at = 0;
    const std::regex record(R"(Record \d+: (\S+) ships to (\S+) with code (\d+)\.)");
    int seen = 0;
    for (std::sregex_iterator it(q.context.begin(), q.context.end(), record), end; it != end; ++it, ++seen) {
      REQUIRE(seen < 24);
      CHECK(want[2 * static_cast<std::size_t>(seen)] == (*it)[1].str() + " ships to " + (*it)[2].str());
      CHECK(want[2 * static_cast<std::size_t>(seen) + 1] == "code " + (*it)[3].str());
      CHECK(static_cast<std::size_t>(it->position()) >= at);
      at = static_cast<std::size_t>(it->position());
    }
    CHECK(seen == 24);
    CHECK(q.context.size() > 800 * 4 * 9 / 10);  // about the requested length
  }
  CHECK(a[0].context == b[0].context);
  CHECK(a[0].context != a[1].context);
  CHECK(a[1].id == "recall-1");
}

TEST_CASE("running-total tasks expect each crate's running sum", "[tasks]") {
  LongOutputSpec spec;
  spec.kind = LongOutputKind::RunningTotal;
  spec.count = 1;
  spec.items = 20;
  spec.approx_tokens = 400;
  const CaptureRequest q = make_long_output_tasks(spec).front();
  CHECK(q.task == "long_running-total:contains_all");
  const auto want = expected_of(q);
  REQUIRE(want.size() == 20);
  const std::regex crate(R"(Crate (\S+) holds (\d+) apples\.)");
  long total = 0;
  std::size_t i = 0;
  for (std::sregex_iterator it(q.context.begin(), q.context.end(), crate), end; it != end; ++it, ++i) {
    REQUIRE(i < want.size());
    total += std::stol((*it)[2].str());
    CHECK(want[i] == (*it)[1].str() + ": " + std::to_string(total));
  }
  CHECK(i == 20);
}

TEST_CASE("continue tasks stop between words and expect the document's next words", "[tasks]") {
  const std::string path = test::scratch_file("document.txt");
  {
    std::ofstream out(path);
    for (int w = 0; w < 4000; ++w) out << "w" << w << (w % 17 == 16 ? "\n" : " ");
  }
  LongOutputSpec spec;
  spec.kind = LongOutputKind::Continue;
  spec.file = path;
  spec.count = 2;
  spec.approx_tokens = 200;
  const auto tasks = make_long_output_tasks(spec);
  REQUIRE(tasks.size() == 2);
  for (const CaptureRequest& q : tasks) {
    INFO(q.id);
    const auto want = expected_of(q);
    REQUIRE(want.size() == 8);  // 40 words, five to a phrase
    // The context's last word and the first expected word are consecutive in the document.
    const std::string last = q.context.substr(q.context.find_last_of(" \n") + 1);
    const int n = std::stoi(last.substr(1));
    CHECK(want[0].rfind("w" + std::to_string(n + 1) + " ", 0) == 0);
  }
  spec.count = 40;
  CHECK_THROWS_WITH(make_long_output_tasks(spec), Catch::Contains(path) && Catch::Contains("--count 40"));
  spec.file.clear();
  CHECK_THROWS_WITH(make_long_output_tasks(spec), Catch::Contains("needs --file"));
  CHECK_THROWS_WITH(parse_long_output_kind("poem"), Catch::Contains("continue | recall | running-total"));
}
