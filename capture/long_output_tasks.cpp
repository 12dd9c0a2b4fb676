#include "capture/long_output_tasks.h"

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/rng.h"

namespace kvsim {

LongOutputKind parse_long_output_kind(const std::string& s) {
  if (s == "continue") return LongOutputKind::Continue;
  if (s == "recall") return LongOutputKind::Recall;
  if (s == "running-total") return LongOutputKind::RunningTotal;
  throw Error("--kind is '" + s + "', expected continue | recall | running-total");
}

const char* long_output_kind_name(LongOutputKind k) {
  switch (k) {
    case LongOutputKind::Continue:
      return "continue";
    case LongOutputKind::Recall:
      return "recall";
    case LongOutputKind::RunningTotal:
      return "running-total";
  }
  return "?";
}

namespace {

const char* kFiller[] = {"The morning train left on time.",     "Rain fell softly on the old roof.",
                         "A clerk sorted the letters by hand.", "The market opened before dawn.",
                         "Two boats waited at the pier.",       "The lamp in the window stayed lit."};
const char* kNames[] = {"Ardent", "Birch",  "Cobalt",  "Dune",    "Ember",   "Fable",  "Garnet",
                        "Harbor", "Indigo", "Juniper", "Kestrel", "Lumen",   "Marble", "Nimbus",
                        "Onyx",   "Pillar", "Quarry",  "Raven",   "Saffron", "Thistle"};
const char* kCities[] = {"Lisbon", "Oslo",  "Quito", "Hanoi", "Dakar",   "Perth",  "Tunis", "Lima",  "Riga",  "Cusco",
                         "Accra",  "Minsk", "Sofia", "Baku",  "Nairobi", "Bergen", "Porto", "Kyoto", "Malmo", "Zagreb"};

// Filler sentences of about `chars` characters with `lines` spread evenly through them.
std::string interleave(Rng& rng, const std::vector<std::string>& lines, std::size_t chars) {
  std::size_t total = 0;
  for (const auto& l : lines) total += l.size() + 1;
  const std::size_t gap = lines.empty() || total >= chars ? 0 : (chars - total) / (lines.size() + 1);
  std::string out;
  auto pad = [&](std::size_t n) {
    const std::size_t end = out.size() + n;
    while (out.size() < end) out += std::string(kFiller[rng.below(std::size(kFiller))]) + " ";
  };
  for (const auto& l : lines) {
    pad(gap);
    out += l + "\n";
  }
  pad(gap);
  return out;
}

// A record name unique within a request: a name and a two-digit tag.
std::string record_name(Rng& rng, int i) {
  return std::string(kNames[rng.below(std::size(kNames))]) + "-" + std::to_string(10 + (i * 37 + 11) % 90);
}

CaptureRequest recall(const LongOutputSpec& spec, Rng& rng) {
  CaptureRequest q;
  std::vector<std::string> lines, expected;
  for (int i = 0; i < spec.items; ++i) {
    const std::string name = record_name(rng, i), city = kCities[rng.below(std::size(kCities))];
    const std::string code = std::to_string(100 + rng.below(900));
    lines.push_back("Record " + std::to_string(i + 1) + ": " + name + " ships to " + city + " with code " + code + ".");
    expected.push_back(name + " ships to " + city);  // scored apart: a record half recalled counts half
    expected.push_back("code " + code);
  }
  q.context = interleave(rng, lines, static_cast<std::size_t>(spec.approx_tokens) * 4);
  q.question =
      "Repeat every record above, in order, one per line, exactly as written: Record 1: ..., Record 2: ..., and so "
      "on.";
  q.expected = nlohmann::json(expected).dump();
  return q;
}

CaptureRequest running_total(const LongOutputSpec& spec, Rng& rng) {
  CaptureRequest q;
  std::vector<std::string> lines, expected;
  long total = 0;
  for (int i = 0; i < spec.items; ++i) {
    const long v = 1 + static_cast<long>(rng.below(9));
    total += v;
    const std::string name = record_name(rng, i);
    lines.push_back("Crate " + name + " holds " + std::to_string(v) + " apples.");
    expected.push_back(name + ": " + std::to_string(total));
  }
  q.context = interleave(rng, lines, static_cast<std::size_t>(spec.approx_tokens) * 4);
  q.question =
      "Go through the crates in the order they appear and keep a running total of the apples. After each crate, "
      "write one line: the crate's name, a colon, and the total so far.";
  q.expected = nlohmann::json(expected).dump();
  return q;
}

// The document's r-th window of the context length, and the words after it as expected phrases
// (five words each) of the true continuation.
CaptureRequest continuation(const LongOutputSpec& spec, const std::string& text, int r) {
  const std::size_t window = static_cast<std::size_t>(spec.approx_tokens) * 4, follow = 2000;
  std::size_t start = static_cast<std::size_t>(r) * (window + follow);
  if (start + window + follow > text.size())
    throw Error(spec.file + ": " + std::to_string(text.size()) + " bytes hold " + std::to_string(r) + " windows of ~" +
                std::to_string(spec.approx_tokens) + " tokens and their continuations; --count " +
                std::to_string(spec.count) + " needs " + std::to_string(spec.count * (window + follow)) + " bytes");
  while (start < text.size() && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) ++start;
  std::size_t end = text.find(' ', start + window);  // stop between words
  if (end == std::string::npos) end = start + window;
  CaptureRequest q;
  q.context = text.substr(start, end - start);
  q.question = "Continue the text above exactly where it stops, for as long as you can.";
  std::vector<std::string> words, expected;
  std::size_t at = end;
  while (words.size() < 40 && at < end + follow) {
    const std::size_t b = text.find_first_not_of(" \n\t", at);
    if (b == std::string::npos) break;
    const std::size_t e = std::min(text.find_first_of(" \n\t", b), text.size());
    words.push_back(text.substr(b, e - b));
    at = e;
  }
  for (std::size_t i = 0; i + 5 <= words.size(); i += 5) {
    std::string phrase = words[i];
    for (std::size_t k = 1; k < 5; ++k) phrase += " " + words[i + k];
    expected.push_back(phrase);
  }
  q.expected = nlohmann::json(expected).dump();
  return q;
}

}  // namespace

std::vector<CaptureRequest> make_long_output_tasks(const LongOutputSpec& spec) {
  if (spec.count < 1 || spec.approx_tokens < 64 || spec.items < 1)
    throw Error("long-output tasks: --count and --items must be >= 1 and --tokens >= 64");
  std::string text;
  if (spec.kind == LongOutputKind::Continue) {
    if (spec.file.empty()) throw Error("long-output tasks: --kind continue needs --file (a UTF-8 document)");
    std::ifstream in(spec.file, std::ios::binary);
    if (!in) throw Error(spec.file + ": cannot open the document");
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  std::vector<CaptureRequest> out;
  for (int r = 0; r < spec.count; ++r) {
    Rng rng(spec.seed, static_cast<std::uint64_t>(r), 0x6c6f6e67);
    CaptureRequest q = spec.kind == LongOutputKind::Recall         ? recall(spec, rng)
                       : spec.kind == LongOutputKind::RunningTotal ? running_total(spec, rng)
                                                                   : continuation(spec, text, r);
    q.id = std::string(long_output_kind_name(spec.kind)) + "-" + std::to_string(r);
    q.task = std::string("long_") + long_output_kind_name(spec.kind) + ":contains_all";
    out.push_back(std::move(q));
  }
  return out;
}

}  // namespace kvsim
