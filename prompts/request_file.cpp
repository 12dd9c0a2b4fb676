#include "prompts/request_file.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/text_lines.h"

namespace kvsim {

namespace {

std::vector<RequestChunk> read_chunks(const nlohmann::json& a, const std::string& where) {
  if (!a.is_array() || a.empty())
    throw FormatError(where + ": field 'chunks' is " + a.dump().substr(0, 40) +
                      "; expected a non-empty array of {\"id\": string, \"text\": string}");
  std::vector<RequestChunk> out;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const std::string at = where + ": chunks[" + std::to_string(i) + "]";
    const nlohmann::json& c = a[i];
    for (const char* key : {"id", "text"})
      if (!c.is_object() || !c.contains(key) || !c[key].is_string() || c[key].get<std::string>().empty())
        throw FormatError(at + ": field '" + key + "' is " +
                          (c.is_object() && c.contains(key) ? c[key].dump().substr(0, 40) : std::string("missing")) +
                          "; expected a non-empty string");
    RequestChunk r{c["id"].get<std::string>(), c["text"].get<std::string>()};
    for (const RequestChunk& o : out)
      if (o.id == r.id) throw FormatError(at + ": chunk id '" + r.id + "' appears twice; expected unique ids");
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace

std::vector<CaptureRequest> read_capture_requests(const std::string& path) {
  std::vector<CaptureRequest> out;
  for_each_json_line(
      path, "a requests file (one JSON object per line)",
      [&](const nlohmann::json& j, const std::string& where, std::int64_t n) {
        auto text = [&](const char* key, bool required) -> std::string {
          if (!j.contains(key)) {
            if (required) throw FormatError(where + ": field '" + key + "' is missing");
            return "";
          }
          if (!j[key].is_string()) throw FormatError(where + ": field '" + key + "' must be a string");
          return j[key].get<std::string>();
        };
        CaptureRequest r;
        r.line = n;
        r.id = j.contains("id") ? (j["id"].is_string() ? j["id"].get<std::string>() : j["id"].dump())
                                : "r" + std::to_string(out.size());
        if (j.contains("chunks")) {
          if (j.contains("context") || j.contains("text"))
            throw FormatError(where + ": fields 'chunks' and '" + (j.contains("text") ? "text" : "context") +
                              "' both given; expected one of them");
          r.chunks = read_chunks(j["chunks"], where);
          for (const RequestChunk& c : r.chunks) r.context += c.text;
          r.question = text("question", true);
        } else if (j.contains("text")) {
          r.context = text("text", true);
        } else {
          r.context = text("context", true);
          r.question = text("question", true);
        }
        r.system = text("system", false);
        r.answer = text("answer", false);
        r.task = text("task", false);
        if (j.contains("expected")) {
          const auto& e = j["expected"];
          if (!e.is_array() || !std::all_of(e.begin(), e.end(), [](const auto& x) { return x.is_string(); }))
            throw FormatError(where + ": field 'expected' must be an array of strings");
          r.expected = e.dump();
        }
        out.push_back(std::move(r));
      });
  if (out.empty()) throw FormatError(path + ": no requests (expected one JSON object per line)");
  return out;
}

void write_requests_jsonl(const std::vector<CaptureRequest>& requests, const std::string& path, bool overwrite) {
  if (!overwrite && std::filesystem::exists(path))
    throw Error(path + ": file exists; refusing to overwrite it (pass --force to replace)");
  std::ofstream out(path, std::ios::trunc);
  if (!out) throw Error(path + ": cannot write");
  for (const auto& r : requests) {
    nlohmann::json j = {{"id", r.id}, {"task", r.task}};
    if (!r.chunks.empty()) {
      for (const RequestChunk& c : r.chunks) j["chunks"].push_back({{"id", c.id}, {"text", c.text}});
      j["question"] = r.question;
    } else if (r.question.empty()) {
      j["text"] = r.context;
    } else {
      j["context"] = r.context;
      j["question"] = r.question;
    }
    if (!r.answer.empty()) j["answer"] = r.answer;
    if (!r.expected.empty()) j["expected"] = nlohmann::json::parse(r.expected);
    if (!r.system.empty()) j["system"] = r.system;
    out << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  }
}

}  // namespace kvsim
