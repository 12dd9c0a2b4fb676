// `kvsim tasks {needle,long,text,chunked}`: write JSONL requests for `kvsim capture`.
#include <boost/program_options.hpp>
#include <iostream>

#include "capture/chunked_tasks.h"
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

int chunked(const Args& args) {
  ChunkedSpec spec;
  spec.file = "/usr/share/common-licenses/GPL-3";
  std::string workload = "rag", out;
  po::options_description desc(
      "kvsim tasks chunked: requests whose context is a sequence of reusable chunks (docs/chunk-states.md), drawn\n"
      "by Zipf popularity from a pool cut from --file, so popular chunks recur after different preceding chunks:\n"
      "  rag    retrieved documents in the retriever's order, then a question about one of them\n"
      "  agent  a system chunk every request shares, then tool outputs, then a question about one of them\n"
      "Each chunk plants an access code; the question asks for one. Scored by 'contains_all'.");
  desc.add_options()("help,h", "show this help")("out,o", po::value(&out)->required(), "output JSONL")(
      "workload", po::value(&workload)->default_value(workload), "rag | agent")(
      "requests", po::value(&spec.requests)->default_value(spec.requests), "requests")(
      "pool", po::value(&spec.pool)->default_value(spec.pool), "distinct chunks (documents or tool outputs)")(
      "per-request", po::value(&spec.per_request)->default_value(spec.per_request),
      "pooled chunks per request (agent: after the system chunk)")(
      "zipf", po::value(&spec.zipf)->default_value(spec.zipf), "popularity exponent: weight 1 / rank^zipf")(
      "chunk-tokens", po::value(&spec.chunk_tokens)->default_value(spec.chunk_tokens),
      "per chunk, estimated at 4 characters a token")("file", po::value(&spec.file)->default_value(spec.file),
                                                      "the text chunks are cut from (UTF-8)")(
      "seed", po::value(&spec.seed)->default_value(spec.seed), "random seed")("force", "replace an existing file");
  po::variables_map vm;
  add_output_flags(desc);
  if (!parse_options(args, desc, po::positional_options_description(), vm,
                     "kvsim tasks chunked --out F.jsonl [options]"))
    return 0;
  spec.workload = parse_chunked_workload(workload);
  const auto reqs = make_chunked_tasks(spec);
  write_requests_jsonl(reqs, out, vm.count("force") > 0);
  std::cout << out << ": " << reqs.size() << " " << workload << " requests of " << spec.per_request
            << " chunks from a pool of " << spec.pool << " (~" << spec.chunk_tokens << " tokens each)\n";
  return 0;
}

}  // namespace

int tasks_command(const Args& args) {
  static const Subcommand subs[] = {{"needle", "RULER-style needle tasks over a synthetic haystack", needle},
                                    {"long", "long-output tasks: continue, recall, running-total", long_output},
                                    {"text", "windows of a text file (KL / perplexity inputs)", text},
                                    {"chunked", "RAG and agent workloads of reusable chunks", chunked}};
  return dispatch("kvsim tasks", subs, args);
}

}  // namespace kvsim::cli
