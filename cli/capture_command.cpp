// `kvsim capture`: record kvtrace files from a real GGUF model.
#include <boost/program_options.hpp>
#include <iostream>

#include "capture/capture_driver.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"

namespace po = boost::program_options;

namespace kvsim::cli {

int capture_command(const Args& args) {
  CaptureOptions o;
  std::string requests, queries = "eval", weights = "quant", device = "cpu";
  po::options_description desc(
      "kvsim capture: run a GGUF model (CPU or CUDA) over JSONL requests and write a kvtrace file with\n"
      "post-RoPE K/V/Q per layer, segments and the reference next-token distribution");
  desc.add_options()("help,h", "show this help")("model,m", po::value(&o.model_path)->required(), "GGUF model file")(
      "requests,r", po::value(&requests)->required(),
      "JSONL: {id, context, question, system?, answer?, task?} or {id, text} per line")(
      "out,o", po::value(&o.out_path)->required(), "output trace (.h5)")(
      "max-new", po::value(&o.max_new)->default_value(o.max_new), "greedy tokens when a request has no answer")(
      "min-new", po::value(&o.min_new)->default_value(o.min_new),
      "no end of generation before this many tokens (the best other token is taken, as min_new_tokens does)")(
      "ref-topk", po::value(&o.ref_topk)->default_value(o.ref_topk), "width of the reference top-k")(
      "queries", po::value(&queries)->default_value(queries),
      "all | eval (queries of the last --query-window context tokens, the question and the answer)")(
      "query-window", po::value(&o.query_window)->default_value(o.query_window), "see --queries eval")(
      "prefill-chunk", po::value(&o.prefill_chunk)->default_value(o.prefill_chunk), "tokens per prefill pass")(
      "repeat-pass",
      "also record KVzip's context-reconstruction pass (queries and keys of the model repeating the "
      "context on top of its cache; the kvzip policy scores with it)")(
      "chunk-states",
      "chunked requests: also record each chunk computed alone (after the header only), keys moved to its "
      "positions; kvsim trace deviation compares it with the chunk in context (docs/chunk-states.md)")(
      "weights", po::value(&weights)->default_value(weights),
      "quant (keep the GGUF blocks, dequantize on the fly) | f32 (dequantize once at load)")(
      "device", po::value(&device)->default_value(device),
      "cpu | cuda (the CUDA engine: fp16 weights on the GPU, Q/K/V copied to the host while the next layer runs)")(
      "force", "replace an existing output file")(
      "resume", "continue a capture that was stopped (OUT.partial): keep its finished requests, capture the rest");
  po::variables_map vm;
  add_output_flags(desc);
  if (!parse_options(args, desc, po::positional_options_description(), vm,
                     "kvsim capture --model M.gguf --requests R.jsonl --out T.h5 [options]"))
    return 0;
  if (queries != "all" && queries != "eval") throw Error("--queries is '" + queries + "', expected all or eval");
  if (o.prefill_chunk < 1 || o.ref_topk < 1 || o.query_window < 0 || o.max_new < 0 || o.min_new < 0 ||
      o.min_new > o.max_new)
    throw Error(
        "--prefill-chunk and --ref-topk must be >= 1, --query-window and --max-new >= 0, --min-new 0 to --max-new");
  o.all_queries = queries == "all";
  o.weights = parse_weight_format(weights);
  o.device = parse_device(device);
  require_device(o.device);
  o.overwrite = vm.count("force") > 0;
  o.resume = vm.count("resume") > 0;
  o.repeat_pass = vm.count("repeat-pass") > 0;
  o.chunk_states = vm.count("chunk-states") > 0;
  const auto reqs = read_capture_requests(requests);
  const CaptureSummary s = run_capture(reqs, o);
  std::cout << o.out_path << ": captured " << s.requests << " requests, " << s.tokens << " tokens in " << s.seconds
            << " s (" << static_cast<double>(s.tokens) / s.seconds << " tokens/s)\n";
  return 0;
}

}  // namespace kvsim::cli
