// `kvsim model {info,dump}`: look inside GGUF model files.
#include <boost/program_options.hpp>
#include <algorithm>
#include <fstream>
#include <iomanip>
#include <iterator>
#include <iostream>
#include <nlohmann/json.hpp>

#include "model/gguf.h"
#include "model/llama_model.h"
#include "model/tokenizer.h"
#include "cli/dispatch.h"
#include "prompts/prompt.h"
#include "cli/options.h"
#include "core/error.h"

namespace po = boost::program_options;

namespace kvsim::cli {
namespace {

std::string value_text(const GgufValue& v) {
  if (const auto* i = std::get_if<std::int64_t>(&v.value)) return std::to_string(*i);
  if (const auto* u = std::get_if<std::uint64_t>(&v.value)) return std::to_string(*u);
  if (const auto* d = std::get_if<double>(&v.value)) {
    std::ostringstream os;
    os << *d;
    return os.str();
  }
  if (const auto* b = std::get_if<bool>(&v.value)) return *b ? "true" : "false";
  if (const auto* s = std::get_if<std::string>(&v.value))
    return s->size() > 60 ? "\"" + s->substr(0, 57) + "...\"" : "\"" + *s + "\"";
  const auto& a = std::get<std::vector<GgufValue>>(v.value);
  return "[" + std::to_string(a.size()) + " items]";
}

int info(const Args& args) {
  std::string file;
  po::options_description desc("kvsim model info: GGUF metadata and tensor table");
  desc.add_options()("help,h", "show this help")("file", po::value(&file)->required(), "GGUF file")(
      "tensors", "list every tensor");
  po::positional_options_description pos;
  pos.add("file", 1);
  po::variables_map vm;
  if (!parse_options(args, desc, pos, vm, "kvsim model info FILE [--tensors]")) return 0;
  const GgufFile f(file);
  std::cout << file << ": GGUF v" << f.version() << ", " << f.metadata().size() << " metadata entries, "
            << f.tensors().size() << " tensors, alignment " << f.alignment() << "\n";
  for (const auto& [k, v] : f.metadata()) std::cout << "  " << std::left << std::setw(44) << k << value_text(v) << "\n";
  std::map<std::string, int> by_type;
  for (const auto& t : f.tensors()) ++by_type[ggml_type_info(static_cast<std::uint32_t>(t.type))->name];
  std::cout << "  tensor types:";
  for (const auto& [t, n] : by_type) std::cout << " " << t << " x" << n;
  std::cout << "\n";
  if (vm.count("tensors"))
    for (const auto& t : f.tensors()) {
      std::cout << "  " << std::left << std::setw(28) << t.name << std::setw(6)
                << ggml_type_info(static_cast<std::uint32_t>(t.type))->name << " [";
      for (std::size_t i = 0; i < t.ne.size(); ++i) std::cout << (i ? ", " : "") << t.ne[i];
      std::cout << "]\n";
    }
  return 0;
}

int dump(const Args& args) {
  std::string file, name;
  std::int64_t row0 = 0, rows = 1;
  po::options_description desc("kvsim model dump: rows of a tensor, dequantized to f32, as JSON");
  desc.add_options()("help,h", "show this help")("file", po::value(&file)->required(), "GGUF file")(
      "tensor", po::value(&name)->required(), "tensor name")("row", po::value(&row0)->default_value(0), "first row")(
      "rows", po::value(&rows)->default_value(1), "number of rows (-1: all)");
  po::positional_options_description pos;
  pos.add("file", 1);
  po::variables_map vm;
  if (!parse_options(args, desc, pos, vm, "kvsim model dump FILE --tensor NAME [--row R --rows N]")) return 0;
  const GgufFile f(file);
  const GgufTensor& t = f.tensor(name);
  if (rows < 0) rows = t.rows() - row0;
  std::vector<float> out(static_cast<std::size_t>(rows * t.row_size()));
  f.dequantize_rows(t, row0, rows, out);
  nlohmann::json j;
  j["tensor"] = name;
  j["type"] = ggml_type_info(static_cast<std::uint32_t>(t.type))->name;
  j["row"] = row0;
  j["rows"] = rows;
  j["row_size"] = t.row_size();
  j["values"] = out;
  std::cout << j.dump() << "\n";
  return 0;
}

int tokenize(const Args& args) {
  std::string file, text, text_file;
  po::options_description desc("kvsim model tokenize: token ids of a text (JSON), with the model's own tokenizer");
  desc.add_options()("help,h", "show this help")("file", po::value(&file)->required(), "GGUF file")(
      "text", po::value(&text), "the text")("text-file", po::value(&text_file), "read the text from a file (UTF-8)")(
      "no-special", "treat <|...|> control-token text as plain text")(
      "chat",
      "wrap the text as a user turn in the model's chat format (default system prompt, BOS where the vocabulary asks)");
  po::positional_options_description pos;
  pos.add("file", 1);
  po::variables_map vm;
  if (!parse_options(args, desc, pos, vm,
                     "kvsim model tokenize FILE (--text T | --text-file F) [--chat] [--no-special]"))
    return 0;
  if (!text_file.empty()) {
    std::ifstream in(text_file, std::ios::binary);
    if (!in) throw Error(text_file + ": cannot open");
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const GgufFile f(file);
  const Tokenizer tok(f);
  if (vm.count("chat")) text = tok.chat(default_system_prompt(f), text);
  auto ids = tok.encode(text, vm.count("no-special") == 0);
  if (vm.count("chat") && tok.add_bos() && tok.bos() >= 0) ids.insert(ids.begin(), tok.bos());  // as capture does
  nlohmann::json j;
  j["ids"] = ids;
  j["decoded"] = tok.decode(ids);
  std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  return 0;
}

int generate(const Args& args) {
  std::string file, text, weights = "quant", device = "cpu";
  int max_new = 32;
  po::options_description desc(
      "kvsim model generate: greedy generation (CPU or CUDA engine), for checking a model by eye;\n"
      "--logits prints the next-token logits of the prompt as JSON instead");
  desc.add_options()("help,h", "show this help")("file", po::value(&file)->required(), "GGUF file")(
      "text", po::value(&text)->required(), "prompt")("chat",
                                                      "wrap the prompt as a user turn in the model's chat format")(
      "max-new", po::value(&max_new)->default_value(max_new), "tokens to generate")(
      "logits", "print the prompt's next-token logits (JSON) and exit")(
      "weights", po::value(&weights)->default_value(weights), "quant | f32 (see kvsim capture --help)")(
      "device", po::value(&device)->default_value(device), "cpu | cuda (see kvsim capture --help)");
  po::positional_options_description pos;
  pos.add("file", 1);
  po::variables_map vm;
  if (!parse_options(args, desc, pos, vm, "kvsim model generate FILE --text T [--chat] [--max-new N] [--logits]"))
    return 0;
  const Device dev = parse_device(device);
  require_device(dev);
  const GgufFile f(file);
  const Tokenizer tok(f);
  const std::unique_ptr<Engine> engine = make_engine(f, EngineOptions{dev, parse_weight_format(weights)});
  Engine& model = *engine;
  if (vm.count("chat")) text = tok.chat(default_system_prompt(f), text);
  std::vector<std::int32_t> ids = tok.encode(text);
  if (tok.add_bos() && tok.bos() >= 0) ids.insert(ids.begin(), tok.bos());
  std::vector<float> logits = model.prefill(ids);
  if (vm.count("logits")) {
    nlohmann::json j;
    j["ids"] = ids;
    j["logits"] = logits;
    std::cout << j.dump() << "\n";
    return 0;
  }
  std::vector<std::int32_t> out;
  for (int step = 0; step < max_new; ++step) {
    const auto next = static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(next);
    if (tok.is_eog(next)) break;
    logits = model.step(next);
  }
  nlohmann::json j;
  j["prompt_ids"] = ids;
  j["generated_ids"] = out;
  j["generated"] = tok.decode(out);
  std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  return 0;
}

}  // namespace

int model_command(const Args& args) {
  static const Subcommand subs[] = {
      {"info", "GGUF metadata and tensor table", info},
      {"dump", "rows of a tensor, dequantized to f32, as JSON", dump},
      {"tokenize", "token ids of a text with the model's tokenizer", tokenize},
      {"generate", "greedy generation on the CPU or CUDA engine (or the prompt's logits)", generate}};
  return dispatch("kvsim model", subs, args);
}

}  // namespace kvsim::cli
