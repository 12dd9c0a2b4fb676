#include "capture/task_gen.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/rng.h"

namespace kvsim {

NeedleKind parse_needle_kind(const std::string& s) {
  if (s == "single") return NeedleKind::Single;
  if (s == "multikey") return NeedleKind::MultiKey;
  if (s == "multivalue") return NeedleKind::MultiValue;
  if (s == "vartrack") return NeedleKind::VariableTracking;
  throw Error("--kind is '" + s + "', expected single | multikey | multivalue | vartrack");
}

const char* needle_kind_name(NeedleKind k) {
  switch (k) {
    case NeedleKind::Single:
      return "single";
    case NeedleKind::MultiKey:
      return "multikey";
    case NeedleKind::MultiValue:
      return "multivalue";
    case NeedleKind::VariableTracking:
      return "vartrack";
  }
  return "?";
}

namespace {

// A repetitive but varied haystack, as in RULER's noise setting.
const char* kFiller[] = {"The grass is green.",        "The sky is blue.",
                         "The sun is yellow.",         "Here we go.",
                         "There and back again.",      "The river flows to the sea.",
                         "Birds fly south in winter.", "A stone rolls down the hill."};
const char* kKeys[] = {"amber-falcon", "quiet-harbor", "silver-maple",  "rapid-comet",  "hollow-pine",
                       "crimson-tide", "gentle-fjord", "brave-lantern", "misty-canyon", "bold-orchid"};

std::string number(Rng& rng) { return std::to_string(1000000 + rng.below(9000000)); }

std::string haystack(Rng& rng, std::size_t chars) {
  std::string s;
  while (s.size() < chars) {
    s += kFiller[rng.below(std::size(kFiller))];
    s += ' ';
  }
  return s;
}

// Inserts `needles` at fractions `depth` (spread around it) of the haystack, at sentence ends.
std::string plant(std::string hay, const std::vector<std::string>& needles, double depth) {
  for (std::size_t i = 0; i < needles.size(); ++i) {
    const double spread = static_cast<double>(i) - static_cast<double>(needles.size() - 1) / 2.0;
    const double d = std::clamp(depth + 0.08 * spread, 0.0, 1.0);
    std::size_t at = static_cast<std::size_t>(d * static_cast<double>(hay.size()));
    at = hay.find(". ", at);
    at = at == std::string::npos ? hay.size() : at + 2;
    hay.insert(at, needles[i] + " ");
  }
  return hay;
}

}  // namespace

std::vector<CaptureRequest> make_needle_tasks(const NeedleSpec& spec) {
  if (spec.count < 1 || spec.approx_tokens < 64) throw Error("needle tasks: --count must be >= 1 and --tokens >= 64");
  std::vector<CaptureRequest> out;
  for (int r = 0; r < spec.count; ++r) {
    Rng rng(spec.seed, static_cast<std::uint64_t>(r));
    const double depth = spec.depth >= 0 ? spec.depth : (r + 0.5) / spec.count;
    const std::string hay = haystack(rng, static_cast<std::size_t>(spec.approx_tokens) * 4);
    CaptureRequest q;
    q.id = std::string(needle_kind_name(spec.kind)) + "-" + std::to_string(r);
    q.task = std::string("needle_") + needle_kind_name(spec.kind) + ":contains_all";
    std::vector<std::string> needles, answers;
    const std::string key = kKeys[rng.below(std::size(kKeys))];
    switch (spec.kind) {
      case NeedleKind::Single: {
        const std::string v = number(rng);
        needles.push_back("One of the special magic numbers for " + key + " is: " + v + ".");
        answers.push_back(v);
        q.question = "What is the special magic number for " + key + " mentioned in the provided text?";
        break;
      }
      case NeedleKind::MultiKey: {
        for (int k = 0; k < 4; ++k) {
          const std::string kk =
              kKeys[(rng.below(std::size(kKeys)) + static_cast<std::uint64_t>(k)) % std::size(kKeys)];
          const std::string v = number(rng);
          needles.push_back("One of the special magic numbers for " + kk + " is: " + v + ".");
          if (k == 0) {
            answers.push_back(v);
            q.question = "What is the special magic number for " + kk + " mentioned in the provided text?";
          }
        }
        break;
      }
      case NeedleKind::MultiValue: {
        for (int k = 0; k < 3; ++k) {
          const std::string v = number(rng);
          needles.push_back("One of the special magic numbers for " + key + " is: " + v + ".");
          answers.push_back(v);
        }
        q.question = "What are all the special magic numbers for " + key + " mentioned in the provided text?";
        break;
      }
      case NeedleKind::VariableTracking: {
        const std::string v = number(rng);
        std::string prev = "VAR X1";
        needles.push_back("VAR X1 = " + v + ".");
        answers.push_back("X1");
        for (int k = 2; k <= 4; ++k) {
          needles.push_back("VAR X" + std::to_string(k) + " = " + prev + ".");
          prev = "VAR X" + std::to_string(k);
          answers.push_back("X" + std::to_string(k));
        }
        q.question = "Find all variables that are assigned the value " + v + " in the text above.";
        break;
      }
    }
    q.context = plant(hay, needles, depth);
    q.expected = nlohmann::json(answers).dump();  // generated freely, then scored against these
    out.push_back(std::move(q));
  }
  return out;
}

std::vector<CaptureRequest> make_text_windows(const std::string& path, int approx_tokens, int count) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open the text file");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::size_t window = static_cast<std::size_t>(approx_tokens) * 4;
  if (approx_tokens < 16 || text.size() < window)
    throw Error(path + ": " + std::to_string(text.size()) + " bytes, too short for one window of ~" +
                std::to_string(approx_tokens) + " tokens (" + std::to_string(window) + " bytes)");
  std::vector<CaptureRequest> out;
  for (int i = 0; i < count && (static_cast<std::size_t>(i) + 1) * window <= text.size(); ++i) {
    CaptureRequest r;
    r.id = "text-" + std::to_string(i);
    std::size_t start = static_cast<std::size_t>(i) * window;
    while (start > 0 && start < text.size() && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) ++start;
    std::size_t end = std::min(text.size(), start + window);
    while (end < text.size() && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) ++end;  // whole UTF-8 chars
    r.context = text.substr(start, end - start);
    r.task = "text:perplexity";
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace kvsim
