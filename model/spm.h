#pragma once
// SentencePiece-style tokenization over a GGUF vocabulary (tokenizer.ggml.model = "llama": Llama 1/2,
// Gemma): spaces become U+2581, then adjacent symbols merge, highest-scoring vocabulary piece
// first, and a symbol no piece covers falls back to its bytes (<0xXX> tokens).
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kvsim {

struct SpmVocab {
  std::unordered_map<std::string, std::int32_t> ids;
  std::vector<float> scores;
  std::int32_t byte_tokens[256];  // <0xXX>, -1 where the vocabulary has none
  std::int32_t unk = -1;
  bool add_space_prefix = true;
};

// Appends the ids of `text` (no special tokens in it) to `out`; throws naming a byte that neither a
// piece nor a byte token covers when the vocabulary has no unknown token.
void spm_encode(const SpmVocab& v, std::string_view text, bool at_start, std::vector<std::int32_t>& out);

// A piece's text: U+2581 back to spaces, <0xXX> back to its byte.
std::string spm_piece_text(const std::string& piece);

}  // namespace kvsim
