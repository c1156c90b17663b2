// Fuzz target: the tokenizer of the real model. The first byte picks the
// mode: encode (with and without special tokens; decode(encode(s)) gives s
// back, less the bytes the vocabulary has no symbol for) or
// streaming decode of token ids (the stream equals decode() with U+FFFD for
// ill-formed bytes, so it is valid UTF-8).
#include <array>
#include <cstdlib>
#include <cstring>

#include "dspark/error.hpp"
#include "fuzz_util.hpp"

namespace {

bool valid_utf8(const std::string& s) {
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
std::string without_dropped_bytes(const dspark::tok::Tokenizer& t, std::string_view text) {
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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dspark;
  if (size == 0) return 0;
  const tok::Tokenizer& t = *fuzz::vocab().tokenizer;
  const uint8_t mode = data[0];
  ++data;
  --size;
  if (mode % 2 == 0) {
    const std::string_view text = fuzz::as_text(data, size);
    // Text round-trips byte for byte, less the bytes without a symbol.
    const std::string kept_text = without_dropped_bytes(t, text);
    if (t.decode(t.encode(text, false)) != kept_text) std::abort();
    if (t.decode(t.encode(text, true)) != kept_text) std::abort();
  } else {
    std::vector<tok::TokenId> ids;
    for (size_t i = 0; i + 2 <= size; i += 2) {
      uint16_t v;
      std::memcpy(&v, data + i, 2);
      ids.push_back(static_cast<tok::TokenId>(v % (t.vocab_size() + 2)));  // a few ids outside the vocabulary
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
