#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "capture/task_gen.h"
#include "core/error.h"

using namespace kvsim;

TEST_CASE("needle tasks plant every expected answer in the context, reproducibly", "[tasks]") {
  for (NeedleKind kind :
       {NeedleKind::Single, NeedleKind::MultiKey, NeedleKind::MultiValue, NeedleKind::VariableTracking}) {
    NeedleSpec spec;
    spec.kind = kind;
    spec.count = 3;
    spec.approx_tokens = 300;
    const auto a = make_needle_tasks(spec), b = make_needle_tasks(spec);
    REQUIRE(a.size() == 3);
    for (std::size_t i = 0; i < a.size(); ++i) {
      INFO(needle_kind_name(kind) << " " << i);
      CHECK(a[i].context == b[i].context);
      CHECK(a[i].task.rfind("needle_", 0) == 0);
      CHECK_FALSE(a[i].question.empty());
      CHECK(a[i].context.size() >= 1200);
      const auto expected = nlohmann::json::parse(a[i].expected);
      REQUIRE(!expected.empty());
      for (const auto& e : expected) {
        if (kind == NeedleKind::VariableTracking) continue;  // variable names, not literal text
        CHECK(a[i].context.find(e.get<std::string>()) != std::string::npos);
      }
    }
    // Default depth spreads the needles over the requests: earlier ones sit earlier.
    if (kind == NeedleKind::Single) {
      const auto pos0 = a[0].context.find("magic number"), pos2 = a[2].context.find("magic number");
      CHECK(pos0 < pos2);
    }
  }
  CHECK_THROWS_WITH(parse_needle_kind("haystack"), Catch::Contains("expected single | multikey"));
}
