#include "serve/request_trace.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "core/error.h"
#include "core/text_lines.h"

namespace kvsim::serve {

std::int64_t RequestTrace::block_references() const {
  std::int64_t n = 0;
  for (const ServeRequest& r : requests) n += static_cast<std::int64_t>(r.blocks.size());
  return n;
}

namespace {

std::int64_t integer_field(const nlohmann::json& j, const char* name, const std::string& where) {
  const auto it = j.find(name);
  if (it == j.end()) throw Error(where + ": field '" + name + "' is missing");
  if (!it->is_number_integer() || it->get<std::int64_t>() < 0)
    throw Error(where + ": field '" + name + "' is " + it->dump() + "; expected an integer >= 0");
  return it->get<std::int64_t>();
}

}  // namespace

RequestTrace read_mooncake_trace(const std::string& path, std::int64_t block_size) {
  if (block_size < 1) throw Error(path + ": block size " + std::to_string(block_size) + "; expected >= 1");
  RequestTrace t;
  t.path = path;
  t.block_size = block_size;
  std::unordered_map<std::int64_t, std::int32_t> index;  // the hash index: file id -> block
  std::vector<std::int64_t> first_line;                  // [block] where it first appeared
  for_each_json_line(
      path, "a Mooncake request trace (one JSON object per line)",
      [&](const nlohmann::json& j, const std::string& where, std::int64_t line) {
        ServeRequest r;
        r.line = line;
        const auto ts = j.find("timestamp");
        if (ts == j.end()) throw Error(where + ": field 'timestamp' is missing");
        if (!ts->is_number() || ts->get<double>() < 0)
          throw Error(where + ": field 'timestamp' is " + ts->dump() + "; expected milliseconds >= 0");
        r.arrival_ms = ts->get<double>();
        if (!t.requests.empty() && r.arrival_ms < t.requests.back().arrival_ms)
          throw Error(where + ": field 'timestamp' is " + ts->dump() + ", earlier than line " +
                      std::to_string(t.requests.back().line) + "'s; expected timestamps in order");
        r.input_tokens = integer_field(j, "input_length", where);
        r.output_tokens = integer_field(j, "output_length", where);
        const auto ids = j.find("hash_ids");
        if (ids == j.end() || !ids->is_array()) throw Error(where + ": field 'hash_ids' is missing or not a list");
        const std::int64_t want = (r.input_tokens + block_size - 1) / block_size;
        if (static_cast<std::int64_t>(ids->size()) != want)
          throw Error(where + ": field 'hash_ids' has " + std::to_string(ids->size()) + " ids; expected " +
                      std::to_string(want) + " (ceil(input_length " + std::to_string(r.input_tokens) + " / " +
                      std::to_string(block_size) + "))");
        std::int32_t prev = -1;
        for (std::size_t i = 0; i < ids->size(); ++i) {
          const nlohmann::json& h = (*ids)[i];
          if (!h.is_number_integer())
            throw Error(where + ": field 'hash_ids' item " + std::to_string(i) + " is " + h.dump() +
                        "; expected an integer");
          const auto [it, fresh] = index.emplace(h.get<std::int64_t>(), static_cast<std::int32_t>(t.parent.size()));
          const std::int32_t b = it->second;
          const std::int64_t tokens =
              i + 1 < ids->size() ? block_size : r.input_tokens - block_size * static_cast<std::int64_t>(i);
          if (fresh) {
            t.parent.push_back(prev);
            t.depth.push_back(static_cast<std::int32_t>(i));
            t.hash.push_back(h.get<std::int64_t>());
            t.tokens.push_back(tokens);
            first_line.push_back(line);
          } else if (t.parent[static_cast<std::size_t>(b)] != prev) {
            throw Error(where + ": field 'hash_ids' item " + std::to_string(i) + " (" + h.dump() +
                        ") follows another block " + "than on line " +
                        std::to_string(first_line[static_cast<std::size_t>(b)]) +
                        "; expected prefix hashes (equal ids = equal prefixes)");
          } else if (t.tokens[static_cast<std::size_t>(b)] != tokens) {
            throw Error(where + ": field 'hash_ids' item " + std::to_string(i) + " (" + h.dump() + ") holds " +
                        std::to_string(tokens) + " tokens here and " +
                        std::to_string(t.tokens[static_cast<std::size_t>(b)]) + " on line " +
                        std::to_string(first_line[static_cast<std::size_t>(b)]) + "; expected one size per block id");
          }
          r.blocks.push_back(b);
          prev = b;
        }
        t.requests.push_back(std::move(r));
      });
  if (t.requests.empty()) throw Error(path + ": no requests");
  return t;
}

RequestTrace replicate(const RequestTrace& trace, int times) {
  if (times < 1) throw Error("replicate: " + std::to_string(times) + " copies; expected >= 1");
  RequestTrace out;
  out.path = trace.path + " x" + std::to_string(times);
  out.block_size = trace.block_size;
  const auto n = static_cast<std::int32_t>(trace.blocks());
  const double span = trace.requests.back().arrival_ms + 1;
  std::int64_t max_hash = 0;
  for (std::int64_t h : trace.hash) max_hash = std::max(max_hash, h);
  for (int k = 0; k < times; ++k) {
    for (std::size_t b = 0; b < trace.blocks(); ++b) {
      out.parent.push_back(trace.parent[b] < 0 ? -1 : trace.parent[b] + k * n);
      out.depth.push_back(trace.depth[b]);
      out.hash.push_back(trace.hash[b] + k * (max_hash + 1));
      out.tokens.push_back(trace.tokens[b]);
    }
    for (ServeRequest r : trace.requests) {
      r.arrival_ms += k * span;
      for (std::int32_t& b : r.blocks) b += k * n;
      out.requests.push_back(std::move(r));
    }
  }
  return out;
}

}  // namespace kvsim::serve
