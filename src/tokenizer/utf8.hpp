// UTF-8 and GPT-2 byte-level utilities shared by the tokenizer sources.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dspark::tok::detail {

/// Appends the UTF-8 encoding of code point `cp` (caller guarantees it is a
/// scalar value, i.e. <= 0x10FFFF and not a surrogate).
void append_utf8(std::string& out, char32_t cp);

/// Result of examining the bytes at the start of a buffer.
enum class Utf8Status { Complete, Incomplete, Invalid };

/// Classifies the UTF-8 sequence that starts at `p` (n >= 1 bytes available).
/// Complete: a well-formed sequence of `len` bytes. Incomplete: a well-formed
/// prefix that needs more bytes (`len` = bytes present). Invalid: an ill-formed
/// sequence whose maximal subpart is `len` bytes (>= 1); each maximal subpart
/// is replaced by one U+FFFD (the Unicode "best practice" rule).
Utf8Status classify_utf8(const unsigned char* p, size_t n, size_t& len);

/// Decodes the well-formed code point at `p` of length `len` (from classify_utf8).
char32_t decode_utf8(const unsigned char* p, size_t len);

/// `bytes` with every ill-formed subsequence replaced by U+FFFD.
std::string utf8_lossy(std::string_view bytes);

/// The GPT-2 byte-to-unicode table: byte b is written as code point
/// byte_to_cp()[b] in byte-level vocabularies (printable Latin-1 bytes map to
/// themselves, the other 68 to U+0100..U+0143 in byte order).
const std::array<char32_t, 256>& byte_to_cp();

/// Inverse of byte_to_cp(): the byte for `cp`, or -1 when cp is not one of the
/// 256 byte symbols.
int cp_to_byte(char32_t cp);

}  // namespace dspark::tok::detail
