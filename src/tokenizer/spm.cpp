// SentencePiece-style merging and special-token partitioning; see spm.hpp.
#include "spm.hpp"

#include <algorithm>
#include <queue>

#include "utf8.hpp"

namespace dspark::tok::detail {

namespace {

// Bytes of the symbol that starts at p: a well-formed UTF-8 character, or
// the maximal ill-formed subpart (classify_utf8). Judging by the lead byte
// alone would let a stray lead byte swallow the first bytes of the next
// character, e.g. of the "▁" a space became, which then decoded as raw bytes.
size_t symbol_len(const char* p, size_t n) {
  size_t len = 1;
  classify_utf8(reinterpret_cast<const unsigned char*>(p), n, len);
  return std::max<size_t>(len, 1);
}

struct Symbol {
  int32_t prev, next;
  size_t start, n;  // bytes text[start, start + n); n == 0 once merged away
};

struct Bigram {
  int32_t left, right;
  float score;
  size_t size;
};

// Priority: higher score first, then the leftmost pair.
struct Lower {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

}  // namespace

std::string spm_escape(std::string_view text, bool prefix_space) {
  std::string out;
  out.reserve(text.size() + text.size() / 2 + 3);
  if (prefix_space) out += "\xE2\x96\x81";
  for (char c : text) {
    if (c == ' ') out += "\xE2\x96\x81";
    else out += c;
  }
  return out;
}

void SpmModel::encode(std::string_view text, std::vector<int32_t>& out) const {
  std::vector<Symbol> sym;
  for (size_t off = 0; off < text.size();) {
    const size_t n = symbol_len(text.data() + off, text.size() - off);
    const int32_t i = static_cast<int32_t>(sym.size());
    sym.push_back({i - 1, i + 1, off, n});
    off += n;
  }
  if (sym.empty()) return;
  sym.back().next = -1;

  std::priority_queue<Bigram, std::vector<Bigram>, Lower> queue;
  auto try_add = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const std::string_view joined = text.substr(sym[left].start, sym[left].n + sym[right].n);
    auto it = index_->find(joined);
    if (it == index_->end() || it->second < 0 || static_cast<size_t>(it->second) >= scores_.size()) return;
    queue.push({left, right, scores_[static_cast<size_t>(it->second)], joined.size()});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(sym.size()); ++i) try_add(i - 1, i);
  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& l = sym[b.left];
    Symbol& r = sym[b.right];
    if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;  // stale: a side already merged
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }
  for (int32_t i = 0; i != -1; i = sym[i].next) {
    const std::string_view piece = text.substr(sym[i].start, sym[i].n);
    if (auto it = index_->find(piece); it != index_->end()) {
      out.push_back(it->second);
      continue;
    }
    for (unsigned char c : piece) {
      const int32_t id = byte_id_[c] >= 0 ? byte_id_[c] : unk_;
      if (id >= 0) out.push_back(id);
    }
  }
}

std::vector<Fragment> partition_special(std::string_view text, const std::vector<SpecialText>& specials,
                                        bool parse_special) {
  std::vector<Fragment> frags = {{text, -1}};
  if (text.empty()) return {};
  bool present[256] = {false};  // bytes of the text: a token starting elsewhere cannot match
  for (unsigned char c : text) present[c] = true;
  std::vector<Fragment> next;
  for (const SpecialText& s : specials) {
    if (s.text.empty() || (s.control && !parse_special) || !present[static_cast<unsigned char>(s.text[0])]) continue;
    next.clear();
    bool split = false;
    for (const Fragment& f : frags) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      size_t from = 0;
      for (size_t hit; (hit = f.text.find(s.text, from)) != std::string_view::npos; from = hit + s.text.size()) {
        if (hit > from) next.push_back({f.text.substr(from, hit - from), -1});
        next.push_back({{}, s.id});
        split = true;
      }
      if (from < f.text.size()) next.push_back({f.text.substr(from), -1});
    }
    if (split) frags.swap(next);
  }
  return frags;
}

}  // namespace dspark::tok::detail
