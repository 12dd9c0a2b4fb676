#pragma once
// Byte-level BPE tokenizer built from a GGUF file's vocabulary and merges (tokenizer.ggml.model
// "gpt2"), with the pre-tokenizers SmolLM2 ("smollm": digits split one by one, then the GPT-2
// pattern) and Qwen2 need, Unicode-aware through PCRE2 (formats.md §1.5, §4). Control and
// user-defined tokens in the text are matched literally before pre-tokenization.
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kvsim {

struct SpmVocab;

class GgufFile;

class Tokenizer {
 public:
  explicit Tokenizer(const GgufFile& file);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // parse_special: text like "<|im_start|>" becomes that control token (chat templates need it).
  std::vector<std::int32_t> encode(std::string_view text, bool parse_special = true) const;
  std::string decode(const std::vector<std::int32_t>& ids) const;

  std::int64_t vocab_size() const { return static_cast<std::int64_t>(tokens_.size()); }
  std::int32_t bos() const { return bos_; }
  std::int32_t eos() const { return eos_; }
  // End of generation: eos, or the end-of-turn token where the model has one (Gemma's
  // <end_of_turn>, or tokenizer.ggml.eot_token_id), as llama.cpp stops on either.
  bool is_eog(std::int32_t id) const { return id == eos_ || (eot_ >= 0 && id == eot_); }
  // The greedy next token; with end_allowed false, the best that does not end generation (as
  // Hugging Face's min_new_tokens does before its minimum).
  std::int32_t greedy_next(std::span<const float> logits, bool end_allowed = true) const;
  bool add_bos() const { return add_bos_; }
  const std::string& pre() const { return pre_; }

  // The model's chat format around one user turn: ChatML (SmolLM2, Qwen2: a system turn, the
  // user turn, the assistant's opening) or Gemma's (no system role: the system text opens the user
  // turn). chat_head is everything before the user's text, chat_tail everything after it.
  std::string chat_head(const std::string& system) const;
  std::string chat_tail() const;
  std::string chat(const std::string& system, const std::string& user) const {
    return chat_head(system) + user + chat_tail();
  }
  bool sentencepiece() const { return spm_ != nullptr; }

 private:
  void load_sentencepiece(const GgufFile& f);
  std::vector<std::string> pre_tokenize(std::string_view text) const;
  void bpe(const std::string& piece, std::vector<std::int32_t>& out) const;

  std::vector<std::string> tokens_;  // in GPT-2's byte-to-unicode alphabet
  std::unordered_map<std::string, std::int32_t> ids_;
  std::unordered_map<std::string, std::int32_t> merge_rank_;    // "left right" -> rank
  std::vector<std::pair<std::string, std::int32_t>> specials_;  // literal text, id; longest first
  std::vector<std::size_t> special_by_byte_[256];               // indices into specials_ by first byte, in its order
  std::vector<std::uint8_t> is_special_;                        // [id] 1: a control or user-defined token
  std::string pre_;
  std::int32_t bos_ = -1, eos_ = -1, eot_ = -1;
  bool add_bos_ = false;
  struct Regexes;
  std::unique_ptr<Regexes> re_;
  std::unique_ptr<SpmVocab> spm_;  // tokenizer.ggml.model = "llama"; null for byte-level BPE
  bool gemma_chat_ = false;
  std::vector<std::uint8_t> user_defined_;  // [id] 1: a user-defined piece, split out of any text
};

}  // namespace kvsim
