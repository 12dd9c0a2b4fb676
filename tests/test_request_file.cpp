// The request file and prompts (prompts/): chunked requests read and written back, refused by
// line and field, and built into prompts whose chunk spans hold each chunk's own tokens.
#include <catch2/catch.hpp>

#include <fstream>

#include "core/error.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "prompts/prompt.h"
#include "prompts/request_file.h"
#include "trace_fixtures.h"

using namespace kvsim;

namespace {

std::string lines(const std::string& name, const std::string& text) {
  const std::string path = test::scratch_file(name);
  std::ofstream(path) << text;
  return path;
}

}  // namespace

TEST_CASE("chunked requests: read, written back, refused by field", "[prompts]") {
  const std::string path = lines(
      "chunked.jsonl",
      R"({"id": "a", "chunks": [{"id": "doc1", "text": "First.\n\n"}, {"id": "doc2", "text": "Second.\n\n"}], "question": "Which?", "expected": ["First"]}
{"id": "b", "context": "Plain.", "question": "Q?"}
)");
  const std::vector<CaptureRequest> r = read_capture_requests(path);
  REQUIRE(r.size() == 2);
  REQUIRE(r[0].chunks.size() == 2);
  CHECK(r[0].chunks[1].id == "doc2");
  CHECK(r[0].context == "First.\n\nSecond.\n\n");
  CHECK(r[1].chunks.empty());
  const std::string back = test::scratch_file("chunked_back.jsonl");
  write_requests_jsonl(r, back, true);
  const std::vector<CaptureRequest> again = read_capture_requests(back);
  CHECK(again[0].chunks.size() == 2);
  CHECK(again[0].chunks[0].text == "First.\n\n");
  CHECK(again[0].question == "Which?");
  CHECK(again[1].context == "Plain.");

  auto refused = [](const std::string& name, const std::string& line, const std::string& message) {
    CHECK_THROWS_WITH(read_capture_requests(lines(name, line + "\n")), Catch::Contains(message));
  };
  refused("c1.jsonl", R"({"chunks": [], "question": "q"})",
          "c1.jsonl:1: field 'chunks' is []; expected a non-empty array");
  refused("c2.jsonl", R"({"chunks": [{"id": "x"}], "question": "q"})", "chunks[0]: field 'text' is missing");
  refused("c3.jsonl", R"({"chunks": [{"id": "x", "text": ""}], "question": "q"})",
          "chunks[0]: field 'text' is \"\"; expected a non-empty string");
  refused("c4.jsonl", R"({"chunks": [{"id": "x", "text": "a"}, {"id": "x", "text": "b"}], "question": "q"})",
          "chunks[1]: chunk id 'x' appears twice");
  refused("c5.jsonl", R"({"chunks": [{"id": "x", "text": "a"}], "context": "c", "question": "q"})",
          "fields 'chunks' and 'context' both given");
  refused("c6.jsonl", R"({"chunks": [{"id": "x", "text": "a"}]})", "field 'question' is missing");
}

TEST_CASE("a chunked prompt: each chunk's span holds its own tokens, wherever it appears", "[prompts]") {
  const GgufFile gguf(KVSIM_TEST_MODEL);
  const Tokenizer tok(gguf);
  const std::string doc = "The depot in Ravenna opens at nine.\n\n";
  CaptureRequest a, b;
  a.chunks = {{"intro", "Notes for the week.\n\n"}, {"doc", doc}};
  b.chunks = {{"doc", doc}};
  a.question = b.question = "When does the depot open?";
  for (const CaptureRequest* r : {&a, &b}) {
    const Prompt p = build_prompt(tok, *r, default_system_prompt(gguf));
    REQUIRE(p.chunks.size() == r->chunks.size());
    CHECK(p.chunks.back().end == p.question_start);
    const ChunkSpan& span = p.chunks.back();
    CHECK(std::vector<std::int32_t>(p.tokens.begin() + span.begin, p.tokens.begin() + span.end) == tok.encode(doc));
    for (std::size_t i = 1; i < p.chunks.size(); ++i) CHECK(p.chunks[i].begin == p.chunks[i - 1].end);
  }
}
