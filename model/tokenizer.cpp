#include "model/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cstdio>
#include <limits>

#include "model/gguf.h"
#include "model/spm.h"
#include "core/error.h"
#include "model/utf8.h"

namespace kvsim {

namespace {

void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// GPT-2's reversible byte -> printable unicode mapping: bytes that are printable stand for
// themselves, the others are shifted to 256 + n.
struct ByteMap {
  std::string to_unicode[256];
  std::unordered_map<std::string, std::uint8_t> to_byte;
  ByteMap() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      std::string s;
      append_utf8(s, printable ? static_cast<std::uint32_t>(b) : static_cast<std::uint32_t>(256 + n++));
      to_unicode[b] = s;
      to_byte[s] = static_cast<std::uint8_t>(b);
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

// Pre-tokenizer regexes per tokenizer.ggml.pre (llama.cpp src/llama-vocab.cpp), applied in turn.
std::vector<std::string> patterns_for(const std::string& pre) {
  const std::string gpt2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
  if (pre == "smollm" || pre == "starcoder" || pre == "refact" || pre == "command-r") return {"\\p{N}", gpt2};
  if (pre == "qwen2" || pre == "deepseek-r1-qwen")
    return {
        "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
        "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"};
  if (pre == "gpt-2" || pre == "default" || pre.empty()) return {gpt2};
  throw FormatError("tokenizer.ggml.pre = '" + pre + "' is not supported (expected smollm, qwen2, gpt-2)");
}

}  // namespace

struct Tokenizer::Regexes {
  std::vector<pcre2_code*> codes;
  ~Regexes() {
    for (auto* c : codes) pcre2_code_free(c);
  }
};

Tokenizer::Tokenizer(const GgufFile& f) : re_(std::make_unique<Regexes>()) {
  const std::string model = f.get_string("tokenizer.ggml.model");
  if (model != "gpt2" && model != "llama")
    throw FormatError(f.path() + ": tokenizer.ggml.model = '" + model +
                      "', expected 'gpt2' (byte-level BPE) or 'llama' (SentencePiece)");
  const std::string arch = f.get_string("general.architecture");
  gemma_chat_ = arch.rfind("gemma", 0) == 0;
  if (model == "llama" && !gemma_chat_)  // the only SentencePiece family whose prompts are built here
    throw FormatError(f.path() + ": a SentencePiece vocabulary on architecture '" + arch +
                      "'; expected gemma3 (other SentencePiece families are not supported yet)");
  pre_ = f.has("tokenizer.ggml.pre") ? f.get_string("tokenizer.ggml.pre") : "default";
  const auto& toks = f.get_array("tokenizer.ggml.tokens");
  const std::vector<GgufValue>* types =
      f.has("tokenizer.ggml.token_type") ? &f.get_array("tokenizer.ggml.token_type") : nullptr;
  tokens_.reserve(toks.size());
  for (std::size_t i = 0; i < toks.size(); ++i) {
    const auto* s = std::get_if<std::string>(&toks[i].value);
    if (!s) throw FormatError(f.path() + ": tokenizer.ggml.tokens[" + std::to_string(i) + "] is not a string");
    tokens_.push_back(*s);
    ids_.emplace(*s, static_cast<std::int32_t>(i));
    if (types && i < types->size() && (*types)[i].is_integer()) {
      const auto* v = std::get_if<std::int64_t>(&(*types)[i].value);
      const std::int64_t t = v ? *v : static_cast<std::int64_t>(std::get<std::uint64_t>((*types)[i].value));
      if ((t == 3 || t == 4) && !s->empty())
        specials_.emplace_back(*s, static_cast<std::int32_t>(i));  // control, user-defined
      if (t == 4) {
        user_defined_.resize(toks.size(), 0);
        user_defined_[i] = 1;
      }
    }
  }
  std::sort(specials_.begin(), specials_.end(), [](const auto& a, const auto& b) {
    return a.first.size() != b.first.size() ? a.first.size() > b.first.size() : a.second < b.second;
  });
  // Gemma has ~6.4K of them: encode looks up only those starting with the current byte, decode
  // reads a flag.
  is_special_.assign(toks.size(), 0);
  for (std::size_t k = 0; k < specials_.size(); ++k) {
    special_by_byte_[static_cast<unsigned char>(specials_[k].first[0])].push_back(k);
    is_special_[static_cast<std::size_t>(specials_[k].second)] = 1;
  }
  eot_ = static_cast<std::int32_t>(f.get_int("tokenizer.ggml.eot_token_id", -1));
  if (eot_ < 0 && gemma_chat_)
    if (const auto it = ids_.find("<end_of_turn>"); it != ids_.end()) eot_ = it->second;
  if (model == "llama") {
    load_sentencepiece(f);
    return;
  }
  const auto& merges = f.get_array("tokenizer.ggml.merges");
  for (std::size_t i = 0; i < merges.size(); ++i) {
    const auto* s = std::get_if<std::string>(&merges[i].value);
    if (!s || s->find(' ') == std::string::npos)
      throw FormatError(f.path() + ": tokenizer.ggml.merges[" + std::to_string(i) + "] is not 'left right'");
    merge_rank_.emplace(*s, static_cast<std::int32_t>(i));
  }
  bos_ = static_cast<std::int32_t>(f.get_int("tokenizer.ggml.bos_token_id", -1));
  eos_ = static_cast<std::int32_t>(f.get_int("tokenizer.ggml.eos_token_id", -1));
  if (f.has("tokenizer.ggml.add_bos_token")) {
    const auto* b = std::get_if<bool>(&f.metadata().at("tokenizer.ggml.add_bos_token").value);
    add_bos_ = b && *b;
  }
  for (const std::string& p : patterns_for(pre_)) {
    int err = 0;
    PCRE2_SIZE off = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.c_str()), PCRE2_ZERO_TERMINATED,
                                     PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
    if (!code) throw Error("tokenizer: cannot compile pre-tokenizer regex " + p);
    re_->codes.push_back(code);
  }
}

Tokenizer::~Tokenizer() = default;

void Tokenizer::load_sentencepiece(const GgufFile& f) {
  spm_ = std::make_unique<SpmVocab>();
  spm_->ids = ids_;
  const auto& scores = f.get_array("tokenizer.ggml.scores");
  if (scores.size() != tokens_.size())
    throw FormatError(f.path() + ": tokenizer.ggml.scores has " + std::to_string(scores.size()) +
                      " entries, expected " + std::to_string(tokens_.size()) + " (one per token)");
  for (const GgufValue& s : scores) {
    const auto* d = std::get_if<double>(&s.value);
    if (!d) throw FormatError(f.path() + ": tokenizer.ggml.scores holds a non-float");
    spm_->scores.push_back(static_cast<float>(*d));
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    const auto it = ids_.find(name);
    spm_->byte_tokens[b] = it == ids_.end() ? -1 : it->second;
  }
  spm_->unk = static_cast<std::int32_t>(f.get_int("tokenizer.ggml.unknown_token_id", -1));
  if (f.has("tokenizer.ggml.add_space_prefix")) {
    const auto* b = std::get_if<bool>(&f.metadata().at("tokenizer.ggml.add_space_prefix").value);
    spm_->add_space_prefix = b && *b;
  }
  bos_ = static_cast<std::int32_t>(f.get_int("tokenizer.ggml.bos_token_id", -1));
  eos_ = static_cast<std::int32_t>(f.get_int("tokenizer.ggml.eos_token_id", -1));
  if (f.has("tokenizer.ggml.add_bos_token")) {
    const auto* b = std::get_if<bool>(&f.metadata().at("tokenizer.ggml.add_bos_token").value);
    add_bos_ = b && *b;
  }
}

std::vector<std::string> Tokenizer::pre_tokenize(std::string_view text) const {
  // Each regex splits every current piece into its matches and the gaps between them.
  std::vector<std::string> pieces{std::string(text)};
  pcre2_match_data* md = nullptr;
  for (pcre2_code* code : re_->codes) {
    md = pcre2_match_data_create_from_pattern(code, nullptr);
    std::vector<std::string> next;
    for (const std::string& piece : pieces) {
      PCRE2_SIZE start = 0, last = 0;
      while (start <= piece.size()) {
        const int rc =
            pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(piece.data()), piece.size(), start, 0, md, nullptr);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
          pcre2_match_data_free(md);
          throw Error("tokenizer: the text is not valid UTF-8 (PCRE2 error " + std::to_string(rc) + ")");
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
        if (ov[0] > last) next.push_back(piece.substr(last, ov[0] - last));
        if (ov[1] > ov[0]) next.push_back(piece.substr(ov[0], ov[1] - ov[0]));
        last = ov[1];
        start = ov[1] > ov[0] ? ov[1] : ov[1] + utf8_len(static_cast<unsigned char>(piece[ov[1]]));
      }
      if (last < piece.size()) next.push_back(piece.substr(last));
    }
    pcre2_match_data_free(md);
    pieces = std::move(next);
  }
  return pieces;
}

void Tokenizer::bpe(const std::string& piece, std::vector<std::int32_t>& out) const {
  // Bytes to GPT-2 unicode symbols, then merge the lowest-ranked adjacent pair until none is left.
  std::vector<std::string> sym;
  for (unsigned char b : piece) sym.push_back(byte_map().to_unicode[b]);
  while (sym.size() > 1) {
    std::int32_t best = std::numeric_limits<std::int32_t>::max();
    std::size_t at = 0;
    for (std::size_t i = 0; i + 1 < sym.size(); ++i) {
      const auto it = merge_rank_.find(sym[i] + " " + sym[i + 1]);
      if (it != merge_rank_.end() && it->second < best) {
        best = it->second;
        at = i;
      }
    }
    if (best == std::numeric_limits<std::int32_t>::max()) break;
    sym[at] += sym[at + 1];
    sym.erase(sym.begin() + static_cast<std::ptrdiff_t>(at) + 1);
  }
  for (const std::string& s : sym) {
    const auto it = ids_.find(s);
    if (it == ids_.end()) throw Error("tokenizer: symbol '" + s + "' is not in the vocabulary");
    out.push_back(it->second);
  }
}

std::vector<std::int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  std::vector<std::int32_t> out;
  std::size_t plain_start = 0, i = 0;
  bool after_special = true;  // SentencePiece's space prefix goes where a text fragment starts
  auto flush = [&](std::size_t end) {
    if (end <= plain_start) return;
    if (spm_)
      spm_encode(*spm_, text.substr(plain_start, end - plain_start), after_special, out);
    else
      for (const std::string& piece : pre_tokenize(text.substr(plain_start, end - plain_start))) bpe(piece, out);
  };
  // User-defined pieces of a SentencePiece vocabulary are split out of any text; control tokens
  // only with parse_special.
  const bool split_user_defined = spm_ && !user_defined_.empty();
  while ((parse_special || split_user_defined) && i < text.size()) {
    bool matched = false;
    for (const std::size_t k : special_by_byte_[static_cast<unsigned char>(text[i])]) {
      const auto& [s, id] = specials_[k];
      if (!parse_special && !user_defined_[static_cast<std::size_t>(id)]) continue;
      if (text.compare(i, s.size(), s) == 0) {
        flush(i);
        out.push_back(id);
        i += s.size();
        plain_start = i;
        after_special = true;
        matched = true;
        break;
      }
    }
    if (!matched) ++i;
  }
  flush(text.size());
  return out;
}

std::string Tokenizer::decode(const std::vector<std::int32_t>& ids) const {
  std::string out;
  for (std::int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) throw Error("tokenizer: token id " + std::to_string(id) + " out of range");
    const bool special = is_special_[static_cast<std::size_t>(id)] != 0;
    const std::string& t = tokens_[static_cast<std::size_t>(id)];
    if (special) {
      out += t;
      continue;
    }
    if (spm_) {
      out += spm_piece_text(t);
      continue;
    }
    for (std::size_t k = 0; k < t.size();) {
      const std::size_t n = utf8_len(static_cast<unsigned char>(t[k]));
      const auto it = byte_map().to_byte.find(t.substr(k, n));
      if (it != byte_map().to_byte.end()) out += static_cast<char>(it->second);
      k += n;
    }
  }
  return out;
}

std::string Tokenizer::chat_head(const std::string& system) const {
  if (gemma_chat_) return "<start_of_turn>user\n" + (system.empty() ? "" : system + "\n\n");
  return (system.empty() ? "" : "<|im_start|>system\n" + system + "<|im_end|>\n") + "<|im_start|>user\n";
}

std::string Tokenizer::chat_tail() const {
  return gemma_chat_ ? "<end_of_turn>\n<start_of_turn>model\n" : "<|im_end|>\n<|im_start|>assistant\n";
}

std::int32_t Tokenizer::greedy_next(std::span<const float> logits, bool end_allowed) const {
  std::int32_t best = -1;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    const auto id = static_cast<std::int32_t>(i);
    if (!end_allowed && is_eog(id)) continue;
    if (best < 0 || logits[i] > logits[static_cast<std::size_t>(best)]) best = id;
  }
  return best;
}

}  // namespace kvsim
