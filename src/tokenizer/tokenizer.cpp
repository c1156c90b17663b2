// Tokenizers built from GGUF `tokenizer.ggml.*` metadata: byte-level BPE
// ("gpt2") and SentencePiece-style merging by scores ("llama").
#include "dspark/tokenizer/tokenizer.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <optional>
#include <unordered_map>
#include <utility>

#include "bpe.hpp"
#include "dspark/error.hpp"
#include "pretokenizer.hpp"
#include "spm.hpp"
#include "utf8.hpp"

namespace dspark::tok {

using detail::BpeScratch;
using detail::MergeTable;
using detail::PreTokenizer;
using detail::SpmModel;

struct Tokenizer::Impl {
  std::vector<std::string> text;   // vocabulary strings (byte-mapped form)
  std::vector<std::string> bytes;  // decoded bytes of each token
  std::vector<TokenType> types;
  std::unordered_map<std::string_view, TokenId> index;  // views into `text`
  SpecialIds specials;
  std::array<TokenId, 256> byte_id{};  // id of each byte's symbol (BPE) or <0xXX> token (SPM), -1 if absent
  std::string pre_name;
  // Byte-level BPE ("gpt2"):
  MergeTable merges;
  std::optional<PreTokenizer> pre;
  // SentencePiece ("llama"):
  std::optional<SpmModel> spm;
  bool add_space_prefix = false;
  std::vector<detail::SpecialText> spm_specials;  // longest first

  struct Special {
    std::string_view text;
    TokenId id;
    bool control;  // matched only when parse_special (user-defined tokens always)
  };
  std::vector<Special> special_tokens;       // longest first
  std::array<bool, 256> special_first{};     // bytes that can start one

  void check_id(TokenId id) const {
    if (id < 0 || static_cast<size_t>(id) >= text.size()) {
      throw InvalidArgument("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                            std::to_string(text.size()) + ")");
    }
  }

  struct Work {
    std::vector<std::string_view> pieces;
    BpeScratch bpe;
  };

  void encode_plain(std::string_view s, Work& w, std::vector<TokenId>& out) const {
    if (s.empty()) return;
    w.pieces.clear();
    pre->split(s, w.pieces);
    for (std::string_view piece : w.pieces) {
      auto& ids = w.bpe.ids;
      ids.clear();
      for (unsigned char c : piece) {
        if (byte_id[c] >= 0) ids.push_back(byte_id[c]);
      }
      detail::bpe_merge(merges, w.bpe, out);
    }
  }

  // llama.cpp's SPM path: special-token fragments, then each run of text
  // escaped (and prefixed with a space after a special token or at the start
  // when add_space_prefix) and merged by scores.
  std::vector<TokenId> encode_spm(std::string_view text, bool parse_special) const {
    std::vector<TokenId> out;
    bool after_special = true;
    for (const auto& f : detail::partition_special(text, spm_specials, parse_special)) {
      if (f.token >= 0) {
        out.push_back(f.token);
        after_special = true;
        continue;
      }
      spm->encode(detail::spm_escape(f.text, add_space_prefix && after_special), out);
      after_special = false;
    }
    return out;
  }
};

namespace {

// Bytes of a vocabulary entry. Byte-level entries map back through the GPT-2
// table; an entry with any character outside that table is kept as its UTF-8
// text, which is also how control and user-defined tokens render.
std::string token_to_bytes(const std::string& s, TokenType type) {
  if (type == TokenType::Control || type == TokenType::UserDefined) return s;
  std::string out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0;
  while (i < s.size()) {
    size_t len = 0;
    if (detail::classify_utf8(p + i, s.size() - i, len) != detail::Utf8Status::Complete) return s;
    const int b = detail::cp_to_byte(detail::decode_utf8(p + i, len));
    if (b < 0) return s;
    out.push_back(static_cast<char>(b));
    i += len;
  }
  return out;
}

// Bytes of a SentencePiece vocabulary entry: "▁" is a space, <0xXX> byte
// tokens are their byte, control and user-defined tokens their text.
std::string spm_token_bytes(const std::string& s, TokenType type) {
  if (type == TokenType::Byte && s.size() == 6 && s.rfind("<0x", 0) == 0 && s[5] == '>')
    return std::string(1, static_cast<char>(std::stoi(s.substr(3, 2), nullptr, 16)));
  if (type != TokenType::Normal) return s;
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s.compare(i, 3, "\xE2\x96\x81") == 0) {
      out += ' ';
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

TokenId special_id(const io::GGUFFile& f, const std::string& key, int64_t n_vocab) {
  const int64_t v = f.get_int_or(key, -1);
  if (v < -1 || v >= n_vocab) {
    throw FormatError(f.path() + ": " + key + " = " + std::to_string(v) +
                      " is outside the vocabulary of " + std::to_string(n_vocab) + " tokens");
  }
  return static_cast<TokenId>(v);
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Tokenizer Tokenizer::from_gguf(const io::GGUFFile& file) {
  const std::string& path = file.path();
  const std::string model = file.get_string("tokenizer.ggml.model");
  if (model != "gpt2" && model != "llama") {
    throw FormatError(path + ": tokenizer.ggml.model is '" + model +
                      "'; supported: 'gpt2' (byte-level BPE) and 'llama' (SentencePiece)");
  }
  const bool spm = model == "llama";
  const std::string pre_name =
      file.has("tokenizer.ggml.pre") ? file.get_string("tokenizer.ggml.pre") : std::string("default");
  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  m.pre_name = pre_name;
  if (!spm) {
    try {
      m.pre.emplace(PreTokenizer::for_name(pre_name));
    } catch (const FormatError& e) {
      throw FormatError(path + ": " + e.what());
    }
  }
  m.text = file.get_string_array("tokenizer.ggml.tokens");
  const int64_t n = static_cast<int64_t>(m.text.size());
  if (n == 0) throw FormatError(path + ": tokenizer.ggml.tokens is empty");
  if (n > INT32_MAX) throw FormatError(path + ": tokenizer.ggml.tokens has too many entries");

  m.types.assign(m.text.size(), TokenType::Normal);
  if (file.has("tokenizer.ggml.token_type")) {
    const std::vector<int64_t> t = file.get_int_array("tokenizer.ggml.token_type");
    if (t.size() != m.text.size()) {
      throw FormatError(path + ": tokenizer.ggml.token_type has " + std::to_string(t.size()) +
                        " entries but tokenizer.ggml.tokens has " + std::to_string(n));
    }
    for (size_t i = 0; i < t.size(); ++i) {
      if (t[i] < 0 || t[i] > 6) {
        throw FormatError(path + ": tokenizer.ggml.token_type[" + std::to_string(i) + "] = " +
                          std::to_string(t[i]) + " is not a known token type (0..6)");
      }
      m.types[i] = static_cast<TokenType>(t[i]);
    }
  }

  m.index.reserve(m.text.size());
  m.bytes.resize(m.text.size());
  for (size_t i = 0; i < m.text.size(); ++i) {
    m.index[m.text[i]] = static_cast<TokenId>(i);
    m.bytes[i] = spm ? spm_token_bytes(m.text[i], m.types[i]) : token_to_bytes(m.text[i], m.types[i]);
  }

  SpecialIds& sp = m.specials;
  sp.bos = special_id(file, "tokenizer.ggml.bos_token_id", n);
  sp.eos = special_id(file, "tokenizer.ggml.eos_token_id", n);
  sp.eot = special_id(file, "tokenizer.ggml.eot_token_id", n);
  if (sp.eot < 0) sp.eot = sp.eos;
  sp.pad = special_id(file, "tokenizer.ggml.padding_token_id", n);
  sp.unk = special_id(file, "tokenizer.ggml.unknown_token_id", n);
  sp.add_bos = file.get_bool_or("tokenizer.ggml.add_bos_token", false);

  for (size_t i = 0; i < m.text.size(); ++i) {
    if ((m.types[i] == TokenType::Control || m.types[i] == TokenType::UserDefined) && !m.text[i].empty()) {
      m.special_tokens.push_back({m.text[i], static_cast<TokenId>(i), m.types[i] == TokenType::Control});
      m.special_first[static_cast<unsigned char>(m.text[i][0])] = true;
    }
  }
  std::stable_sort(m.special_tokens.begin(), m.special_tokens.end(),
                   [](const Impl::Special& a, const Impl::Special& b) { return a.text.size() > b.text.size(); });

  if (spm) {
    const std::vector<double> scores = file.get_float_array("tokenizer.ggml.scores");
    if (scores.size() != m.text.size())
      throw FormatError(path + ": tokenizer.ggml.scores has " + std::to_string(scores.size()) +
                        " entries but tokenizer.ggml.tokens has " + std::to_string(n));
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      auto it = m.index.find(name);
      m.byte_id[b] = it == m.index.end() ? -1 : it->second;
    }
    m.spm.emplace(m.index, std::vector<float>(scores.begin(), scores.end()), m.byte_id, sp.unk);
    m.add_space_prefix = file.get_bool_or("tokenizer.ggml.add_space_prefix", true);
    for (const auto& st : m.special_tokens)
      m.spm_specials.push_back({st.text, st.id, m.types[static_cast<size_t>(st.id)] == TokenType::Control});
    return Tokenizer(std::move(impl));
  }

  const auto& b2c = detail::byte_to_cp();
  for (int b = 0; b < 256; ++b) {
    std::string sym;
    detail::append_utf8(sym, b2c[b]);
    auto it = m.index.find(sym);
    m.byte_id[b] = it == m.index.end() ? -1 : it->second;
  }

  const std::vector<std::string> merges = file.get_string_array("tokenizer.ggml.merges");
  m.merges.reserve(merges.size());
  std::string joined;
  for (size_t r = 0; r < merges.size(); ++r) {
    const std::string& mg = merges[r];
    bool ok = false;
    // Byte-level symbols never contain a space, so the first space normally
    // separates the pair; other spaces are tried for vocabularies where a
    // token does contain one.
    for (size_t sp = mg.find(' '); sp != std::string::npos && !ok; sp = mg.find(' ', sp + 1)) {
      const std::string_view left(mg.data(), sp), right(mg.data() + sp + 1, mg.size() - sp - 1);
      auto l = m.index.find(left), rr = m.index.find(right);
      if (l == m.index.end() || rr == m.index.end()) continue;
      joined.assign(left);
      joined.append(right);
      auto j = m.index.find(joined);
      if (j == m.index.end()) continue;
      m.merges.insert(l->second, rr->second, static_cast<int32_t>(r), j->second);
      ok = true;
    }
    if (!ok) {
      throw FormatError(path + ": tokenizer.ggml.merges[" + std::to_string(r) + "] = '" + mg +
                        "' is not two vocabulary tokens whose concatenation is a vocabulary token");
    }
  }

  return Tokenizer(std::move(impl));
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool parse_special) const {
  const Impl& m = *impl_;
  if (m.spm) return m.encode_spm(text, parse_special);
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 4);
  Impl::Work w;
  if (m.special_tokens.empty()) {
    m.encode_plain(text, w, out);
    return out;
  }
  size_t seg = 0;  // start of the text not yet encoded
  size_t i = 0;
  while (i < text.size()) {
    if (!m.special_first[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    const std::string_view rest = text.substr(i);
    const Impl::Special* hit = nullptr;
    for (const auto& s : m.special_tokens) {
      if ((parse_special || !s.control) && rest.starts_with(s.text)) {
        hit = &s;
        break;
      }
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    m.encode_plain(text.substr(seg, i - seg), w, out);
    out.push_back(hit->id);
    i += hit->text.size();
    seg = i;
  }
  m.encode_plain(text.substr(seg), w, out);
  return out;
}

std::string Tokenizer::decode(const std::vector<TokenId>& ids) const {
  std::string out;
  for (TokenId id : ids) out += token_bytes(id);
  return out;
}

const std::string& Tokenizer::token_bytes(TokenId id) const {
  impl_->check_id(id);
  return impl_->bytes[static_cast<size_t>(id)];
}

const std::string& Tokenizer::token_text(TokenId id) const {
  impl_->check_id(id);
  return impl_->text[static_cast<size_t>(id)];
}

int64_t Tokenizer::vocab_size() const { return static_cast<int64_t>(impl_->text.size()); }

const SpecialIds& Tokenizer::specials() const { return impl_->specials; }

TokenType Tokenizer::token_type(TokenId id) const {
  impl_->check_id(id);
  return impl_->types[static_cast<size_t>(id)];
}

bool Tokenizer::is_eog(TokenId id) const {
  const SpecialIds& s = impl_->specials;
  return id >= 0 && (id == s.eos || id == s.eot);
}

std::optional<TokenId> Tokenizer::find_token(std::string_view text) const {
  auto it = impl_->index.find(text);
  if (it == impl_->index.end()) return std::nullopt;
  return it->second;
}

const std::string& Tokenizer::pre_tokenizer_name() const { return impl_->pre_name; }

}  // namespace dspark::tok
