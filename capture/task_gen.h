#pragma once
// Task generators for capture: RULER-style needle-in-a-haystack requests at a requested length
// (single, multi-key, multi-value, variable tracking) over a synthetic haystack, and long-text
// windows from a user's file for KL / perplexity inputs. Each request carries its answer and the
// scoring rule that judges a model's output.
#include <cstdint>
#include <string>
#include <vector>

#include "prompts/request_file.h"

namespace kvsim {

enum class NeedleKind { Single, MultiKey, MultiValue, VariableTracking };
NeedleKind parse_needle_kind(const std::string& s);
const char* needle_kind_name(NeedleKind k);

struct NeedleSpec {
  NeedleKind kind = NeedleKind::Single;
  int count = 4;
  int approx_tokens = 1024;  // context length, estimated at 4 characters per token
  double depth = -1;         // needle position as a fraction of the context; < 0: spread over requests
  std::uint64_t seed = 1;
};

// Requests with id, context, question, the expected strings (JSON array) and
// task = "needle_<kind>:contains_all" (the scoring rule: every expected string appears in the output).
std::vector<CaptureRequest> make_needle_tasks(const NeedleSpec& spec);

// Consecutive windows of about `approx_tokens` tokens of a text file: {id, text} requests.
std::vector<CaptureRequest> make_text_windows(const std::string& path, int approx_tokens, int count);

}  // namespace kvsim
