#include "capture/chunked_tasks.h"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/rng.h"
#include "core/zipf.h"

namespace kvsim {

ChunkedWorkload parse_chunked_workload(const std::string& s) {
  if (s == "rag") return ChunkedWorkload::Rag;
  if (s == "agent") return ChunkedWorkload::Agent;
  throw Error("--workload is '" + s + "', expected rag | agent");
}

const char* chunked_workload_name(ChunkedWorkload w) { return w == ChunkedWorkload::Rag ? "rag" : "agent"; }

namespace {

const char* kNames[] = {"Ardent", "Birch",   "Cobalt",  "Dune",    "Ember",  "Fable",  "Garnet", "Harbor",
                        "Indigo", "Juniper", "Kestrel", "Lumen",   "Marble", "Nimbus", "Onyx",   "Pillar",
                        "Quarry", "Raven",   "Saffron", "Thistle", "Umber",  "Vesper", "Willow", "Yarrow"};

struct PoolChunk {
  std::string id, name, answer, text;
};

// The pool: consecutive windows of the text, each with a title line and a planted fact (a code
// unique in the pool) at a sentence boundary near its middle.
std::vector<PoolChunk> make_pool(const ChunkedSpec& spec, const std::string& text, Rng& rng) {
  const std::size_t window = static_cast<std::size_t>(spec.chunk_tokens) * 4;
  const bool agent = spec.workload == ChunkedWorkload::Agent;
  std::vector<PoolChunk> pool;
  std::size_t at = 0;
  for (int k = 0; k < spec.pool; ++k) {
    while (at < text.size() && (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80) ++at;
    if (at + window > text.size())
      throw Error(spec.file + ": " + std::to_string(text.size()) + " bytes hold " + std::to_string(k) + " chunks of ~" +
                  std::to_string(spec.chunk_tokens) + " tokens; --pool " + std::to_string(spec.pool) + " needs " +
                  std::to_string(static_cast<std::size_t>(spec.pool) * window) + " bytes");
    std::size_t end = text.find(' ', at + window);
    if (end == std::string::npos) end = at + window;
    std::string body = text.substr(at, end - at);
    at = end;
    PoolChunk c;
    c.id = std::string(agent ? "tool-" : "doc-") + std::to_string(k);
    c.name = std::string(kNames[static_cast<std::size_t>(k) % std::size(kNames)]) + "-" + std::to_string(k);
    c.answer = std::to_string(1000 + (k * 7919 + static_cast<int>(rng.below(97))) % 9000);
    const std::string fact = " The access code of " + c.name + " is " + c.answer + ".";
    std::size_t mid = body.find(". ", body.size() / 2);
    mid = mid == std::string::npos ? body.size() : mid + 1;
    body.insert(mid, fact);
    c.text = (agent ? "Tool output (lookup " + c.name + "):\n" : "Document " + c.name + ":\n") + body + "\n\n";
    pool.push_back(std::move(c));
  }
  return pool;
}

const char kSystemChunk[] =
    "You are an agent with two tools. lookup(name) returns the stored notes of an item, and may be called many "
    "times; answer(text) ends the task. Read every tool output before you answer, quote codes exactly, and answer "
    "with the code alone when asked for one.\n\n";

}  // namespace

std::vector<CaptureRequest> make_chunked_tasks(const ChunkedSpec& spec) {
  if (spec.requests < 1 || spec.pool < 1 || spec.per_request < 1 || spec.chunk_tokens < 16 || !(spec.zipf >= 0) ||
      spec.zipf > 8)
    throw Error(
        "chunked tasks: --requests, --pool and --per-request must be >= 1, --chunk-tokens >= 16, --zipf in "
        "[0, 8] (steeper leaves the tail no weight to draw distinct chunks from)");
  if (spec.per_request > spec.pool)
    throw Error("chunked tasks: --per-request " + std::to_string(spec.per_request) + " exceeds --pool " +
                std::to_string(spec.pool) + "; expected distinct chunks in a request");
  std::ifstream in(spec.file, std::ios::binary);
  if (!in) throw Error(spec.file + ": cannot open the text chunks are cut from (--file)");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Rng rng(spec.seed);
  const std::vector<PoolChunk> pool = make_pool(spec, text, rng);
  const ZipfPicker popular(static_cast<std::int64_t>(pool.size()), spec.zipf, rng);
  const bool agent = spec.workload == ChunkedWorkload::Agent;
  std::vector<CaptureRequest> out;
  for (int r = 0; r < spec.requests; ++r) {
    const std::vector<std::int64_t> picked = popular.distinct(rng, spec.per_request);  // in draw order
    CaptureRequest q;
    q.id = std::string(chunked_workload_name(spec.workload)) + "-" + std::to_string(r);
    q.task = std::string(chunked_workload_name(spec.workload)) + ":contains_all";
    if (agent) q.chunks.push_back({"system", kSystemChunk});
    for (const std::int64_t k : picked)
      q.chunks.push_back({pool[static_cast<std::size_t>(k)].id, pool[static_cast<std::size_t>(k)].text});
    const PoolChunk& asked = pool[static_cast<std::size_t>(picked[rng.below(picked.size())])];
    q.question = "What is the access code of " + asked.name + "? Answer with the code.";
    q.expected = nlohmann::json(std::vector<std::string>{asked.answer}).dump();
    for (const RequestChunk& c : q.chunks) q.context += c.text;
    out.push_back(std::move(q));
  }
  return out;
}

}  // namespace kvsim
