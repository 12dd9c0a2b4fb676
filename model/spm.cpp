#include "model/spm.h"

#include <queue>

#include "core/error.h"
#include "model/utf8.h"

namespace kvsim {

namespace {

const std::string kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space

struct Symbol {
  std::size_t start, len;
  int prev, next;
};

struct Bigram {
  float score;
  int left;
  std::size_t len;  // of the merged text, to drop stale entries
  bool operator<(const Bigram& o) const { return score != o.score ? score < o.score : left > o.left; }
};

class Merger {
 public:
  Merger(const SpmVocab& v, const std::string& text) : v_(v), text_(text) {
    for (std::size_t i = 0; i < text.size();) {
      const std::size_t n = std::min(utf8_len(static_cast<unsigned char>(text[i])), text.size() - i);
      sym_.push_back({i, n, static_cast<int>(sym_.size()) - 1, static_cast<int>(sym_.size()) + 1});
      i += n;
    }
    if (!sym_.empty()) sym_.back().next = -1;
  }

  // Merges the best-scoring adjacent pair that is a vocabulary piece, until none is.
  void run() {
    for (std::size_t i = 1; i < sym_.size(); ++i) offer(static_cast<int>(i) - 1, static_cast<int>(i));
    while (!queue_.empty()) {
      const Bigram b = queue_.top();
      queue_.pop();
      Symbol& l = sym_[static_cast<std::size_t>(b.left)];
      if (l.len == 0 || l.next < 0) continue;
      Symbol& r = sym_[static_cast<std::size_t>(l.next)];
      if (l.len + r.len != b.len) continue;  // one side changed since it was offered
      merged_[text_.substr(l.start, l.len + r.len)] = {text_.substr(l.start, l.len), text_.substr(r.start, r.len)};
      l.len += r.len;
      r.len = 0;
      l.next = r.next;
      if (r.next >= 0) sym_[static_cast<std::size_t>(r.next)].prev = b.left;
      offer(l.prev, b.left);
      offer(b.left, l.next);
    }
  }

  void emit(std::vector<std::int32_t>& out) const {
    for (int i = sym_.empty() ? -1 : 0; i >= 0; i = sym_[static_cast<std::size_t>(i)].next)
      resegment(text_.substr(sym_[static_cast<std::size_t>(i)].start, sym_[static_cast<std::size_t>(i)].len), out);
  }

 private:
  void offer(int left, int right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = sym_[static_cast<std::size_t>(left)];
    const Symbol& r = sym_[static_cast<std::size_t>(right)];
    const auto it = v_.ids.find(text_.substr(l.start, l.len + r.len));
    if (it == v_.ids.end()) return;
    queue_.push({v_.scores[static_cast<std::size_t>(it->second)], left, l.len + r.len});
  }

  // A symbol's ids: its piece, else the two parts it was merged from, else its bytes.
  void resegment(const std::string& s, std::vector<std::int32_t>& out) const {
    if (const auto it = v_.ids.find(s); it != v_.ids.end()) {
      out.push_back(it->second);
      return;
    }
    if (const auto m = merged_.find(s); m != merged_.end()) {
      resegment(m->second.first, out);
      resegment(m->second.second, out);
      return;
    }
    for (const unsigned char c : s) {
      const std::int32_t id = v_.byte_tokens[c] >= 0 ? v_.byte_tokens[c] : v_.unk;
      if (id < 0) throw Error("tokenizer: byte " + std::to_string(c) + " has no piece, byte token or unknown token");
      out.push_back(id);
    }
  }

  const SpmVocab& v_;
  const std::string& text_;
  std::vector<Symbol> sym_;
  std::priority_queue<Bigram> queue_;
  std::unordered_map<std::string, std::pair<std::string, std::string>> merged_;
};

}  // namespace

void spm_encode(const SpmVocab& v, std::string_view text, bool at_start, std::vector<std::int32_t>& out) {
  std::string s = v.add_space_prefix && at_start ? kSpace : "";
  for (const char c : text) s += c == ' ' ? kSpace : std::string(1, c);
  Merger m(v, s);
  m.run();
  m.emit(out);
}

std::string spm_piece_text(const std::string& piece) {
  if (piece.size() == 6 && piece.rfind("<0x", 0) == 0 && piece[5] == '>')
    return std::string(1, static_cast<char>(std::stoi(piece.substr(3, 2), nullptr, 16)));
  std::string out;
  for (std::size_t i = 0; i < piece.size();) {
    if (piece.compare(i, kSpace.size(), kSpace) == 0) {
      out += ' ';
      i += kSpace.size();
    } else {
      out += piece[i++];
    }
  }
  return out;
}

}  // namespace kvsim
