// The body of the tokenizer fuzz targets (tokenizer.cpp: SmolLM2's byte-level
// BPE; tokenizer_spm.cpp: Gemma 3's SentencePiece). The first byte picks the
// mode: encode (with and without special tokens; decode(encode(s)) gives s
// back, less the bytes the vocabulary has no symbol for, and for
// SentencePiece with "▁" read back as the space it stands for) or streaming
// decode of token ids (the stream equals decode() with U+FFFD for ill-formed
// bytes, so it is valid UTF-8).
#pragma once

#include <array>
#include <cstdlib>
#include <cstring>

#include "dspark/error.hpp"
#include "fuzz_util.hpp"

namespace dspark::fuzz {

inline bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

// `text` without the bytes the vocabulary has no symbol for (the tokenizer
// drops those, see tokenizer.hpp).
// Each target drives one tokenizer, so the table is computed once.
inline std::string without_dropped_bytes(const dspark::tok::Tokenizer& t, std::string_view text) {
  static const std::array<bool, 256> dropped = [&t] {
    std::array<bool, 256> d{};
    for (int b = 0; b < 256; ++b) d[static_cast<size_t>(b)] = t.encode(std::string(1, static_cast<char>(b)), false).empty();
    return d;
  }();
  std::string out;
  for (char c : text)
    if (!dropped[static_cast<unsigned char>(c)]) out.push_back(c);
  return out;
}

// What decode(encode(text)) must give: SentencePiece writes spaces as "▁"
// (U+2581), so a "▁" in the text comes back as a space.
inline std::string round_trip_text(const dspark::tok::Tokenizer& t, std::string_view text, bool spm) {
  const std::string kept = without_dropped_bytes(t, text);
  if (!spm) return kept;
  static constexpr std::string_view kMeta = "\xE2\x96\x81";
  std::string out;
  for (size_t i = 0; i < kept.size();) {
    const bool meta = std::string_view(kept).substr(i, kMeta.size()) == kMeta;
    out.push_back(meta ? ' ' : kept[i]);
    i += meta ? kMeta.size() : 1;
  }
  return out;
}

inline int fuzz_tokenizer(const tok::Tokenizer& t, bool spm, const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  ++data;
  --size;
  if (mode % 2 == 0) {
    const std::string_view text = fuzz::as_text(data, size);
    // Text round-trips byte for byte, less the bytes without a symbol.
    const std::string kept_text = round_trip_text(t, text, spm);
    if (t.decode(t.encode(text, false)) != kept_text) std::abort();
    if (t.decode(t.encode(text, true)) != kept_text) std::abort();
  } else {
    // Ids of 2 bytes, or 3 for a vocabulary past 65,534 (Gemma's 262,144);
    // a few fall outside the vocabulary.
    const uint32_t n_ids = static_cast<uint32_t>(t.vocab_size()) + 2;
    const size_t width = n_ids > 65536 ? 3 : 2;
    std::vector<tok::TokenId> ids;
    for (size_t i = 0; i + width <= size; i += width) {
      uint32_t v = 0;
      std::memcpy(&v, data + i, width);
      ids.push_back(static_cast<tok::TokenId>(v % n_ids));
    }
    tok::StreamDecoder stream(t);
    std::string streamed;
    std::vector<tok::TokenId> kept;
    for (tok::TokenId id : ids) {
      try {
        streamed += stream.push(id);
        kept.push_back(id);
      } catch (const InvalidArgument&) {
        if (id < t.vocab_size()) std::abort();
      }
    }
    streamed += stream.flush();
    if (!valid_utf8(streamed)) std::abort();
    if (valid_utf8(t.decode(kept)) && streamed != t.decode(kept)) std::abort();
  }
  return 0;
}

}  // namespace dspark::fuzz
