#include "serve/chunk_workload.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/rng.h"
#include "core/zipf.h"

namespace kvsim::serve {

ChunkWorkloadKind parse_chunk_workload(const std::string& s) {
  if (s == "rag") return ChunkWorkloadKind::Rag;
  if (s == "agent") return ChunkWorkloadKind::Agent;
  throw Error("--workload is '" + s + "', expected rag | agent");
}

namespace {

void check(const ChunkWorkloadSpec& s) {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw Error("chunked serving workload: " + what);
  };
  need(s.requests >= 1 && s.pool >= 1 && s.per_request >= 1, "--requests, --pool and --per-request must be >= 1");
  need(s.per_request <= s.pool, "--per-request " + std::to_string(s.per_request) + " exceeds --pool " +
                                    std::to_string(s.pool) + " (a request's chunks are distinct)");
  need(s.zipf >= 0 && s.zipf <= 8, "--zipf must be in [0, 8]");
  need(s.chunk_tokens >= 2 && s.system_tokens >= 1 && s.question_tokens >= 0 && s.output_tokens >= 1,
       "--chunk-tokens must be >= 2, --system-tokens and --output-tokens >= 1, --question-tokens >= 0");
  need(s.rate > 0 && std::isfinite(s.rate), "--rate must be > 0 requests per second");
}

nlohmann::json chunk(const std::string& id, std::int64_t tokens) { return {{"id", id}, {"tokens", tokens}}; }

}  // namespace

std::string chunk_workload_jsonl(const ChunkWorkloadSpec& spec) {
  check(spec);
  Rng rng(spec.seed);
  const bool agent = spec.kind == ChunkWorkloadKind::Agent;
  std::vector<std::int64_t> tokens(static_cast<std::size_t>(spec.pool));
  for (auto& t : tokens)
    t = spec.chunk_tokens / 2 + static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(spec.chunk_tokens) + 1));
  const ZipfPicker popular(spec.pool, spec.zipf, rng);
  const std::string prefix = agent ? "tool-" : "doc-";
  std::string out;
  double now_ms = 0;
  std::vector<std::int64_t> session;  // agent: the open session's tool outputs so far
  for (int r = 0; r < spec.requests; ++r) {
    now_ms += -std::log(1.0 - rng.uniform()) / spec.rate * 1e3;
    std::vector<std::int64_t> picked;
    if (agent) {
      if (r % spec.per_request == 0) session.clear();  // a new session
      std::int64_t k = popular.draw(rng);
      while (std::find(session.begin(), session.end(), k) != session.end()) k = popular.draw(rng);
      session.push_back(k);
      picked = session;
    } else {
      picked = popular.distinct(rng, spec.per_request);
    }
    nlohmann::json chunks = nlohmann::json::array({chunk("system", spec.system_tokens)});
    for (const std::int64_t k : picked)
      chunks.push_back(chunk(prefix + std::to_string(k), tokens[static_cast<std::size_t>(k)]));
    const nlohmann::json line = {{"timestamp", std::round(now_ms * 1000) / 1000},
                                 {"chunks", chunks},
                                 {"question_tokens", spec.question_tokens},
                                 {"output_length", spec.output_tokens}};
    out += line.dump() + "\n";
  }
  return out;
}

}  // namespace kvsim::serve
