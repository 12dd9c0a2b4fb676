#include "prompts/request_file.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/text_lines.h"

namespace kvsim {

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
        if (j.contains("text")) {
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
    if (r.question.empty()) {
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
