// `kvsim tasks {needle,long,text}`: write JSONL requests for `kvsim capture`.
#include <boost/program_options.hpp>
#include <iostream>

#include "capture/long_output_tasks.h"
#include "capture/task_gen.h"
#include "cli/dispatch.h"
#include "cli/options.h"
#include "core/error.h"

namespace po = boost::program_options;

namespace kvsim::cli {
namespace {

int needle(const Args& args) {
  NeedleSpec spec;
  std::string kind = "single", out;
  po::options_description desc(
      "kvsim tasks needle: RULER-style needle-in-a-haystack requests (synthetic haystack, answers\n"
      "recorded with the scoring rule 'contains_all')");
  desc.add_options()("help,h", "show this help")("out,o", po::value(&out)->required(), "output JSONL")(
      "kind", po::value(&kind)->default_value(kind), "single | multikey | multivalue | vartrack")(
      "count", po::value(&spec.count)->default_value(spec.count), "requests")(
      "tokens", po::value(&spec.approx_tokens)->default_value(spec.approx_tokens),
      "context length (estimated at 4 characters a token)")("depth", po::value(&spec.depth)->default_value(spec.depth),
                                                            "needle depth in [0, 1]; < 0 spreads them")(
      "seed", po::value(&spec.seed)->default_value(spec.seed), "random seed")("force", "replace an existing file");
  po::variables_map vm;
  add_output_flags(desc);
  if (!parse_options(args, desc, po::positional_options_description(), vm,
                     "kvsim tasks needle --out F.jsonl [options]"))
    return 0;
  spec.kind = parse_needle_kind(kind);
  const auto reqs = make_needle_tasks(spec);
  write_requests_jsonl(reqs, out, vm.count("force") > 0);
  std::cout << out << ": " << reqs.size() << " " << kind << " needle requests of ~" << spec.approx_tokens
            << " tokens\n";
  return 0;
}

int long_output(const Args& args) {
  LongOutputSpec spec;
  std::string kind = "recall", out;
  po::options_description desc(
      "kvsim tasks long: requests whose answers run to hundreds of tokens, so a cache held to its budget while the\n"
      "model generates keeps evicting (capture them with --max-new 256 or more). Kinds:\n"
      "  continue       continue a document (--file) where the context stops; expected: its next words\n"
      "  recall         list every record of a list spread through the context (--items)\n"
      "  running-total  keep a running total over values spread through the context (--items)\n"
      "Scored by 'contains_all' (the share of expected strings in the free generation).");
  desc.add_options()("help,h", "show this help")("out,o", po::value(&out)->required(), "output JSONL")(
      "kind", po::value(&kind)->default_value(kind), "continue | recall | running-total")(
      "count", po::value(&spec.count)->default_value(spec.count), "requests")(
      "tokens", po::value(&spec.approx_tokens)->default_value(spec.approx_tokens),
      "context length (estimated at 4 characters a token)")("items", po::value(&spec.items)->default_value(spec.items),
                                                            "recall, running-total: records in the context")(
      "file", po::value(&spec.file), "continue: the document (UTF-8 text)")(
      "seed", po::value(&spec.seed)->default_value(spec.seed), "random seed")("force", "replace an existing file");
  po::variables_map vm;
  add_output_flags(desc);
  if (!parse_options(args, desc, po::positional_options_description(), vm, "kvsim tasks long --out F.jsonl [options]"))
    return 0;
  spec.kind = parse_long_output_kind(kind);
  const auto reqs = make_long_output_tasks(spec);
  write_requests_jsonl(reqs, out, vm.count("force") > 0);
  std::cout << out << ": " << reqs.size() << " " << kind << " long-output requests of ~" << spec.approx_tokens
            << " tokens\n";
  return 0;
}

int text(const Args& args) {
  std::string file, out;
  int tokens = 1024, count = 4;
  po::options_description desc("kvsim tasks text: consecutive windows of a text file, for KL / perplexity inputs");
  desc.add_options()("help,h", "show this help")("file", po::value(&file)->required(), "UTF-8 text file")(
      "out,o", po::value(&out)->required(), "output JSONL")("tokens", po::value(&tokens)->default_value(tokens),
                                                            "window length (estimated at 4 characters a token)")(
      "count", po::value(&count)->default_value(count), "windows")("force", "replace an existing file");
  po::positional_options_description pos;
  pos.add("file", 1);
  po::variables_map vm;
  add_output_flags(desc);
  if (!parse_options(args, desc, pos, vm, "kvsim tasks text FILE --out F.jsonl [options]")) return 0;
  const auto reqs = make_text_windows(file, tokens, count);
  write_requests_jsonl(reqs, out, vm.count("force") > 0);
  std::cout << out << ": " << reqs.size() << " text windows of ~" << tokens << " tokens\n";
  return 0;
}

}  // namespace

int tasks_command(const Args& args) {
  static const Subcommand subs[] = {{"needle", "RULER-style needle tasks over a synthetic haystack", needle},
                                    {"long", "long-output tasks: continue, recall, running-total", long_output},
                                    {"text", "windows of a text file (KL / perplexity inputs)", text}};
  return dispatch("kvsim tasks", subs, args);
}

}  // namespace kvsim::cli
