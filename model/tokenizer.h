#pragma once
// Byte-level BPE tokenizer built from a GGUF file's vocabulary and merges (tokenizer.ggml.model
// "gpt2"), with the pre-tokenizers SmolLM2 ("smollm": digits split one by one, then the GPT-2
// pattern) and Qwen2 need, Unicode-aware through PCRE2 (formats.md §1.5, §4). Control and
// user-defined tokens in the text are matched literally before pre-tokenization.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kvsim {

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
  bool add_bos() const { return add_bos_; }
  const std::string& pre() const { return pre_; }

  // ChatML as SmolLM2 and Qwen2 use it: the system turn (the model's default prompt when empty),
  // the user turn, then the assistant's opening (the generation prompt).
  static std::string chatml(const std::string& system, const std::string& user);

 private:
  std::vector<std::string> pre_tokenize(std::string_view text) const;
  void bpe(const std::string& piece, std::vector<std::int32_t>& out) const;

  std::vector<std::string> tokens_;  // in GPT-2's byte-to-unicode alphabet
  std::unordered_map<std::string, std::int32_t> ids_;
  std::unordered_map<std::string, std::int32_t> merge_rank_;  // "left right" -> rank
  std::vector<std::pair<std::string, std::int32_t>> specials_;  // literal text, id; longest first
  std::string pre_;
  std::int32_t bos_ = -1, eos_ = -1;
  bool add_bos_ = false;
  struct Regexes;
  std::unique_ptr<Regexes> re_;
};

}  // namespace kvsim
