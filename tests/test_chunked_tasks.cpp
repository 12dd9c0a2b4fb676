// capture/chunked_tasks: RAG and agent workloads of reusable chunks drawn by Zipf popularity.
#include <catch2/catch.hpp>

#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "capture/chunked_tasks.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/zipf.h"

using namespace kvsim;

namespace {

ChunkedSpec spec_of(ChunkedWorkload w) {
  ChunkedSpec s;
  s.workload = w;
  s.requests = 40;
  s.pool = 12;
  s.per_request = 3;
  s.chunk_tokens = 64;
  s.file = "/usr/share/common-licenses/GPL-3";
  s.seed = 5;
  return s;
}

}  // namespace

TEST_CASE("zipf draws: the k-th most popular item with weight 1 / k^s", "[tasks]") {
  const std::vector<double> cdf = zipf_cdf(4, 1.0);  // weights 1, 1/2, 1/3, 1/4 of 25/12
  CHECK(cdf[0] == Approx(12.0 / 25));
  CHECK(cdf[3] == Approx(1.0));
  Rng rng(3);
  std::vector<int> counts(4, 0);
  for (int i = 0; i < 40000; ++i) ++counts[static_cast<std::size_t>(zipf_draw(rng.uniform(), cdf))];
  CHECK(counts[0] / 40000.0 == Approx(12.0 / 25).margin(0.01));
  CHECK(counts[3] / 40000.0 == Approx(3.0 / 25).margin(0.01));
  CHECK(zipf_cdf(3, 0.0)[0] == Approx(1.0 / 3));  // s = 0: uniform
}

TEST_CASE("chunked workloads: reusable chunks after different predecessors, answers in context", "[tasks]") {
  for (const ChunkedWorkload w : {ChunkedWorkload::Rag, ChunkedWorkload::Agent}) {
    INFO(chunked_workload_name(w));
    const ChunkedSpec spec = spec_of(w);
    const auto a = make_chunked_tasks(spec), b = make_chunked_tasks(spec);
    REQUIRE(a.size() == 40);
    std::map<std::string, std::string> text_of;           // a chunk id has one text everywhere
    std::map<std::string, std::set<std::string>> before;  // the chunks seen right before each
    std::map<std::string, int> uses;
    for (std::size_t i = 0; i < a.size(); ++i) {
      const CaptureRequest& q = a[i];
      CHECK(q.id == b[i].id);
      CHECK(q.context == b[i].context);  // reproducible
      CHECK(q.chunks.size() == static_cast<std::size_t>(spec.per_request + (w == ChunkedWorkload::Agent ? 1 : 0)));
      if (w == ChunkedWorkload::Agent) CHECK(q.chunks.front().id == "system");
      const auto expected = nlohmann::json::parse(q.expected).get<std::vector<std::string>>();
      REQUIRE(expected.size() == 1);
      CHECK(q.context.find("is " + expected[0] + ".") != std::string::npos);
      std::string prev = "(header)";
      for (const RequestChunk& c : q.chunks) {
        if (text_of.count(c.id)) CHECK(text_of[c.id] == c.text);
        text_of[c.id] = c.text;
        before[c.id].insert(prev);
        ++uses[c.id];
        prev = c.id;
      }
    }
    // Popular chunks recur, and after more than one predecessor: states differ.
    int most = 0, varied = 0;
    for (const auto& [id, n] : uses) most = std::max(most, n);
    for (const auto& [id, s] : before) varied += s.size() > 1 ? 1 : 0;
    CHECK(most >= 10);
    CHECK(varied >= 3);
  }
  ChunkedSpec bad = spec_of(ChunkedWorkload::Rag);
  bad.per_request = 13;
  CHECK_THROWS_WITH(make_chunked_tasks(bad), Catch::Contains("--per-request 13 exceeds --pool 12"));
  bad = spec_of(ChunkedWorkload::Rag);
  bad.pool = 400;
  bad.chunk_tokens = 512;
  CHECK_THROWS_WITH(make_chunked_tasks(bad), Catch::Contains("--pool 400 needs"));
  CHECK_THROWS_WITH(parse_chunked_workload("chat"), Catch::Contains("expected rag | agent"));
}
