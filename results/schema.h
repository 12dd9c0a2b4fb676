#pragma once
// The schema number every kvsim result file carries (docs/result-files.md): in its configuration
// ("schema": N) or, for files without one, in its banner ("... (schema N): ..."). A file without a
// number was written before kvsim numbered them and is schema 1; a number above what this build
// reads is refused, naming the file and both numbers.
#include <string>

namespace kvsim::results {

// `found` checked against the newest schema `current` of the file kind `kind` ("sweep result file").
void check_schema(int found, int current, const std::string& path, const std::string& kind);

// The schema named in a banner line that starts with `prefix`; 1 when it names none.
int banner_schema(const std::string& banner, const std::string& prefix, const std::string& path);
// A file's banner (its first line), which must start with `prefix` (else an error naming `kind`),
// its schema checked against `current`: the schema, and the text after its first ": " (empty when
// none).
struct Banner {
  int schema = 1;
  std::string rest;
};
Banner read_banner(const std::string& path, const std::string& prefix, const std::string& kind, int current);

// `prefix` followed by " (schema N)".
std::string banner_with_schema(const std::string& prefix, int schema);

// The configuration line of the CSV kinds that carry one: "# config: " + one line of JSON.
std::string config_line(const std::string& json);
bool is_config_line(const std::string& line);
std::string config_json(const std::string& line);  // the JSON of a config line

}  // namespace kvsim::results
