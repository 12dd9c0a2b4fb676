#include "prompts/prompt.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "model/gguf.h"
#include "model/tokenizer.h"
#include "traces/trace_schema.h"

namespace kvsim {

std::string default_system_prompt(const GgufFile& gguf) {
  const std::string base = gguf.has("general.basename") ? gguf.get_string("general.basename") : "";
  const std::string arch = gguf.get_string("general.architecture");
  if (base.rfind("smollm", 0) == 0) return "You are a helpful AI assistant named SmolLM, trained by Hugging Face";
  if (arch == "qwen2") return "You are a helpful assistant.";  // Gemma has no system role: none by default
  return "";
}

Prompt build_prompt(const Tokenizer& tok, const CaptureRequest& r, const std::string& default_system) {
  Prompt p;
  const std::string sys = r.system.empty() ? default_system : r.system;
  auto add = [&](const std::string& text, Segment s) {
    for (auto id : tok.encode(text)) {
      p.tokens.push_back(id);
      p.segments.push_back(static_cast<std::int8_t>(s));
    }
  };
  if (tok.add_bos() && tok.bos() >= 0) {
    p.tokens.push_back(tok.bos());
    p.segments.push_back(static_cast<std::int8_t>(Segment::System));
  }
  add(tok.chat_head(sys), Segment::System);
  const auto context_start = static_cast<std::int64_t>(p.tokens.size());
  if (r.chunks.empty()) add(r.context, Segment::Context);
  for (const RequestChunk& c : r.chunks) {  // each on its own: the same tokens wherever it appears
    const auto begin = static_cast<std::int64_t>(p.tokens.size());
    add(c.text, Segment::Context);
    p.chunks.push_back({c.id, begin, static_cast<std::int64_t>(p.tokens.size())});
  }
  // The needle: the sentence of the context holding the first expected answer, as a token span
  // (byte-level BPE decodes token by token back to the exact bytes).
  if (!r.expected.empty()) {
    const auto expected = nlohmann::json::parse(r.expected);
    const std::size_t at = expected.empty() ? std::string::npos : r.context.find(expected[0].get<std::string>());
    if (at != std::string::npos) {
      const std::size_t dot = r.context.rfind(". ", at);
      const std::size_t begin = dot == std::string::npos ? 0 : dot + 2;
      const std::size_t end_dot = r.context.find('.', at);
      const std::size_t end = end_dot == std::string::npos ? r.context.size() : end_dot + 1;
      std::size_t bytes = 0;
      for (std::int64_t t = context_start; t < static_cast<std::int64_t>(p.tokens.size()); ++t) {
        const std::size_t next = bytes + tok.decode({p.tokens[static_cast<std::size_t>(t)]}).size();
        if (p.needle_start < 0 && next > begin) p.needle_start = t;
        if (next >= end) {
          p.needle_end = t + 1;
          break;
        }
        bytes = next;
      }
      if (p.needle_start < 0 || p.needle_end <= p.needle_start) p.needle_start = p.needle_end = -1;
    }
  }
  p.question_start = static_cast<std::int64_t>(p.tokens.size());
  add((r.question.empty() ? "" : "\n\n" + r.question) + tok.chat_tail(), Segment::Question);
  return p;
}

std::vector<std::pair<std::int64_t, std::int64_t>> prefill_chunks(std::int64_t end,
                                                                  const std::vector<std::int64_t>& splits,
                                                                  std::int64_t chunk) {
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  for (std::int64_t s = 0; s < end;) {
    std::int64_t e = std::min(end, s + chunk);
    for (const std::int64_t split : splits)
      if (s < split && split < e) e = split;
    out.emplace_back(s, e);
    s = e;
  }
  return out;
}

std::vector<std::int64_t> prompt_splits(const Prompt& p) {
  std::vector<std::int64_t> out{p.question_start};
  for (const ChunkSpan& c : p.chunks) out.push_back(c.begin);
  return out;
}

std::vector<std::string> expected_strings(const CaptureRequest& r) {
  std::vector<std::string> out;
  if (!r.expected.empty())
    for (const auto& e : nlohmann::json::parse(r.expected)) out.push_back(e.get<std::string>());
  else if (!r.answer.empty())
    out.push_back(r.answer);
  return out;
}

}  // namespace kvsim
