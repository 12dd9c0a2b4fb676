#pragma once
// Task generators whose answers are long (hundreds of tokens), so a cache held to its budget while
// the model generates must keep evicting (decode-time eviction; docs/learned.md): continue a
// document, recall every record of a list from the context, keep a running total over values in
// the context. Each request carries expected strings scored by 'contains_all' (the share found in
// the free generation); live KL is measured against the full cache's own continuation, so it is
// meaningful where a small model answers wrongly.
#include <cstdint>
#include <string>
#include <vector>

#include "prompts/request_file.h"

namespace kvsim {

enum class LongOutputKind { Continue, Recall, RunningTotal };
LongOutputKind parse_long_output_kind(const std::string& s);
const char* long_output_kind_name(LongOutputKind k);

struct LongOutputSpec {
  LongOutputKind kind = LongOutputKind::Recall;
  int count = 4;
  int approx_tokens = 1024;  // context length, estimated at 4 characters per token
  int items = 32;            // recall: records; running total: values (each answer line ~8 tokens)
  std::string file;          // continue: the document (UTF-8 text)
  std::uint64_t seed = 1;
};

// Requests with id "<kind>-<i>", context, question, expected strings (JSON array) and task
// "long_<kind>:contains_all". Throws naming the flag or file when the spec cannot be met.
std::vector<CaptureRequest> make_long_output_tasks(const LongOutputSpec& spec);

}  // namespace kvsim
