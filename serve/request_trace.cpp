#include "serve/request_trace.h"

#include <algorithm>
#include <fstream>
#include <map>
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

std::int64_t RequestTrace::nominal_block_tokens() const {
  if (block_size > 0 || tokens.empty()) return std::max<std::int64_t>(1, block_size);
  std::int64_t sum = 0;
  for (const std::int64_t t : tokens) sum += t;
  return std::max<std::int64_t>(1, sum / static_cast<std::int64_t>(tokens.size()));
}

namespace {

std::int64_t integer_field(const nlohmann::json& j, const char* name, const std::string& where) {
  const auto it = j.find(name);
  if (it == j.end()) throw Error(where + ": field '" + name + "' is missing");
  if (!it->is_number_integer() || it->get<std::int64_t>() < 0)
    throw Error(where + ": field '" + name + "' is " + it->dump() + "; expected an integer >= 0");
  return it->get<std::int64_t>();
}

// A request's arrival: milliseconds >= 0, not before the previous request's.
double timestamp_field(const nlohmann::json& j, const std::string& where, const RequestTrace& t) {
  const auto ts = j.find("timestamp");
  if (ts == j.end()) throw Error(where + ": field 'timestamp' is missing");
  if (!ts->is_number() || ts->get<double>() < 0)
    throw Error(where + ": field 'timestamp' is " + ts->dump() + "; expected milliseconds >= 0");
  if (!t.requests.empty() && ts->get<double>() < t.requests.back().arrival_ms)
    throw Error(where + ": field 'timestamp' is " + ts->dump() + ", earlier than line " +
                std::to_string(t.requests.back().line) + "'s; expected timestamps in order");
  return ts->get<double>();
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
        r.arrival_ms = timestamp_field(j, where, t);
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
            t.start.push_back(block_size * static_cast<std::int64_t>(i));
            t.chunk.push_back(b);  // every block is a chunk of one state
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

namespace {

// One request of a chunked trace: its chunks as states (blocks) of the trace's tree.
void add_chunked_request(RequestTrace& t, const nlohmann::json& j, const std::string& where, std::int64_t line,
                         std::unordered_map<std::string, std::int32_t>& chunk_index,
                         std::map<std::pair<std::int32_t, std::int32_t>, std::int32_t>& state_index,
                         std::vector<std::int64_t>& chunk_line, std::vector<std::int64_t>& chunk_tokens) {
  ServeRequest r;
  r.line = line;
  r.arrival_ms = timestamp_field(j, where, t);
  r.output_tokens = integer_field(j, "output_length", where);
  r.question_tokens = integer_field(j, "question_tokens", where);
  const auto chunks = j.find("chunks");
  if (chunks == j.end() || !chunks->is_array() || chunks->empty())
    throw Error(where + ": field 'chunks' is missing or not a non-empty list");
  std::int32_t prev = -1;
  std::int64_t pos = 0;
  for (std::size_t i = 0; i < chunks->size(); ++i) {
    const nlohmann::json& c = (*chunks)[i];
    const std::string at = where + ": chunks[" + std::to_string(i) + "]";
    if (!c.is_object() || !c.contains("id") || !c["id"].is_string() || c["id"].get<std::string>().empty())
      throw Error(at + ": field 'id' is missing or not a non-empty string");
    const std::int64_t tokens = integer_field(c, "tokens", at);
    if (tokens < 1) throw Error(at + ": field 'tokens' is 0; expected an integer > 0");
    const std::string id = c["id"].get<std::string>();
    const auto [ci, new_chunk] = chunk_index.emplace(id, static_cast<std::int32_t>(t.chunk_ids.size()));
    if (new_chunk) {
      t.chunk_ids.push_back(id);
      chunk_line.push_back(line);
      chunk_tokens.push_back(tokens);
    }
    for (const std::int32_t b : r.blocks)
      if (t.chunk[static_cast<std::size_t>(b)] == ci->second)
        throw Error(at + ": chunk '" + id + "' appears twice in the request; expected distinct chunks");
    const auto [si, new_state] =
        state_index.emplace(std::pair{prev, ci->second}, static_cast<std::int32_t>(t.blocks()));
    if (new_state) {
      t.parent.push_back(prev);
      t.depth.push_back(static_cast<std::int32_t>(i));
      t.hash.push_back(si->second);
      t.tokens.push_back(tokens);
      t.start.push_back(pos);
      t.chunk.push_back(ci->second);
    }
    if (chunk_tokens[static_cast<std::size_t>(ci->second)] != tokens)  // every state holds the chunk's tokens
      throw Error(at + ": chunk '" + id + "' holds " + std::to_string(tokens) + " tokens here and " +
                  std::to_string(chunk_tokens[static_cast<std::size_t>(ci->second)]) + " on line " +
                  std::to_string(chunk_line[static_cast<std::size_t>(ci->second)]) + "; expected one size per chunk");
    r.blocks.push_back(si->second);
    prev = si->second;
    pos += tokens;
  }
  r.input_tokens = pos + r.question_tokens;
  t.requests.push_back(std::move(r));
}

}  // namespace

RequestTrace read_chunked_trace(const std::string& path) {
  RequestTrace t;
  t.path = path;
  t.block_size = 0;
  std::unordered_map<std::string, std::int32_t> chunk_index;
  std::map<std::pair<std::int32_t, std::int32_t>, std::int32_t> state_index;  // (parent state, chunk) -> state
  std::vector<std::int64_t> chunk_line, chunk_tokens;  // [chunk] where it first appeared, its tokens
  for_each_json_line(path, "a chunked serving trace (one JSON object per line)",
                     [&](const nlohmann::json& j, const std::string& where, std::int64_t line) {
                       add_chunked_request(t, j, where, line, chunk_index, state_index, chunk_line, chunk_tokens);
                     });
  if (t.requests.empty()) throw Error(path + ": no requests");
  return t;
}

RequestTrace read_serve_trace(const std::string& path) {
  std::ifstream in(path);
  std::string first;
  while (in && std::getline(in, first) && first.find_first_not_of(" \t\r") == std::string::npos) {
  }
  const nlohmann::json j = nlohmann::json::parse(first, nullptr, false);
  return j.is_object() && j.contains("chunks") ? read_chunked_trace(path) : read_mooncake_trace(path);
}

RequestTrace replicate(const RequestTrace& trace, int times) {
  if (times < 1) throw Error("replicate: " + std::to_string(times) + " copies; expected >= 1");
  RequestTrace out;
  out.path = trace.path + " x" + std::to_string(times);
  out.block_size = trace.block_size;
  const auto n = static_cast<std::int32_t>(trace.blocks());
  const auto chunks = static_cast<std::int32_t>(trace.chunked() ? trace.chunk_ids.size() : trace.blocks());
  const double span = trace.requests.back().arrival_ms + 1;
  std::int64_t max_hash = 0;
  for (std::int64_t h : trace.hash) max_hash = std::max(max_hash, h);
  for (int k = 0; k < times; ++k) {
    for (std::size_t b = 0; b < trace.blocks(); ++b) {
      out.parent.push_back(trace.parent[b] < 0 ? -1 : trace.parent[b] + k * n);
      out.depth.push_back(trace.depth[b]);
      out.hash.push_back(trace.hash[b] + k * (max_hash + 1));
      out.tokens.push_back(trace.tokens[b]);
      out.start.push_back(trace.start[b]);
      out.chunk.push_back(trace.chunk[b] + k * chunks);
    }
    for (const std::string& id : trace.chunk_ids) out.chunk_ids.push_back(id + "#" + std::to_string(k));
    for (ServeRequest r : trace.requests) {
      r.arrival_ms += k * span;
      for (std::int32_t& b : r.blocks) b += k * n;
      out.requests.push_back(std::move(r));
    }
  }
  return out;
}

}  // namespace kvsim::serve
