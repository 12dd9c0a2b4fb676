// Fuzz target: capture request files (JSON lines, capture/capture_driver.h), each request then
// built into its prompt by both real tokenizers (SmolLM2's byte-level BPE, Gemma 3's
// SentencePiece) as `kvsim capture` does. Seeds: `kvsim tasks` output of every kind.
#include <cstdint>
#include <memory>

#include "capture/capture_driver.h"
#include "prompts/prompt.h"
#include "core/error.h"
#include "fuzz/fuzz_input.h"
#include "model/gguf.h"
#include "model/tokenizer.h"

namespace {

struct Model {
  std::unique_ptr<kvsim::GgufFile> file;
  std::unique_ptr<kvsim::Tokenizer> tok;
  std::string system;
};

// The tokenizers of the models setup.sh fetched, loaded once per process.
const std::vector<Model>& models() {
  static const std::vector<Model> all = [] {
    std::vector<Model> out;
    for (const char* name : {"SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"}) {
      Model m;
      m.file = std::make_unique<kvsim::GgufFile>(std::string(KVSIM_FUZZ_MODEL_DIR) + "/" + name);
      m.tok = std::make_unique<kvsim::Tokenizer>(*m.file);
      m.system = kvsim::default_system_prompt(*m.file);
      out.push_back(std::move(m));
    }
    return out;
  }();
  return all;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto& tokenizers = models();
  const std::string path = kvsim::fuzz::input_file(data, size, "requests.jsonl");
  try {
    const auto requests = kvsim::read_capture_requests(path);
    for (const auto& r : requests) {
      (void)kvsim::expected_strings(r);
      for (const auto& m : tokenizers) (void)kvsim::build_prompt(*m.tok, r, m.system);
    }
  } catch (const kvsim::Error&) {
  }
  return 0;
}
