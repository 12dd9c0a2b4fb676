// Fuzz target: GGUF model files (model/gguf.*), and what a load does with them: every tensor's
// first row dequantized, the tokenizer built from the metadata and run, and the engine built and
// run on three tokens. Seeds: the real SmolLM2 and Gemma 3 files shrunk by tiny_gguf.py.
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "fuzz/fuzz_input.h"
#include "model/engine.h"
#include "model/gguf.h"
#include "model/tokenizer.h"

namespace {

void dequantize_first_rows(const kvsim::GgufFile& f) {
  std::vector<float> row;
  for (const auto& t : f.tensors()) {
    if (t.rows() <= 0 || t.row_size() <= 0 || t.row_size() > (1 << 20)) continue;
    row.resize(static_cast<std::size_t>(t.row_size()));
    f.dequantize_rows(t, 0, 1, row);
  }
}

void run_tokenizer(const kvsim::GgufFile& f) {
  const kvsim::Tokenizer tok(f);
  const auto ids = tok.encode(tok.chat("You are helpful.", "Héllo, wörld! 12345 <|im_end|>\n\tdone"));
  (void)tok.decode(ids);
}

void run_engine(const kvsim::GgufFile& f) {
  auto engine = kvsim::make_engine(f, {});
  const auto& c = engine->config();
  // A hostile header can declare a model too large to run in a fuzzing process; the loader has
  // accepted it, which is what this target checks. Only small models are run.
  if (static_cast<double>(c.n_embd) * c.n_ff * c.n_layers > 1e8) return;
  const std::int32_t vocab = static_cast<std::int32_t>(c.vocab);
  if (vocab < 3) return;
  const std::vector<std::int32_t> tokens = {1, vocab / 2, vocab - 1}, positions = {0, 1, 2};
  const std::vector<std::int64_t> rows = {2};
  engine->reserve(3);
  (void)engine->forward(tokens, positions, rows);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = kvsim::fuzz::input_file(data, size, "model.gguf");
  try {
    const kvsim::GgufFile f(path);
    dequantize_first_rows(f);
    try {
      run_tokenizer(f);
    } catch (const kvsim::Error&) {
    }
    run_engine(f);
  } catch (const kvsim::Error&) {
  }
  return 0;
}
