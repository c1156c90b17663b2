#include "utf8.hpp"

namespace dspark::tok::detail {

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

Utf8Status classify_utf8(const unsigned char* p, size_t n, size_t& len) {
  const unsigned char b0 = p[0];
  if (b0 < 0x80) {
    len = 1;
    return Utf8Status::Complete;
  }
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;  // no overlong forms
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;  // no overlong forms
    if (b0 == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    len = 1;  // stray continuation byte, C0/C1 or F5..FF
    return Utf8Status::Invalid;
  }
  for (size_t i = 1; i < need; ++i) {
    if (i >= n) {
      len = i;
      return Utf8Status::Incomplete;
    }
    const unsigned char lower = i == 1 ? lo : 0x80;
    const unsigned char upper = i == 1 ? hi : 0xBF;
    if (p[i] < lower || p[i] > upper) {
      len = i;
      return Utf8Status::Invalid;
    }
  }
  len = need;
  return Utf8Status::Complete;
}

char32_t decode_utf8(const unsigned char* p, size_t len) {
  switch (len) {
    case 1: return p[0];
    case 2: return (char32_t(p[0] & 0x1F) << 6) | (p[1] & 0x3F);
    case 3: return (char32_t(p[0] & 0x0F) << 12) | (char32_t(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
    default:
      return (char32_t(p[0] & 0x07) << 18) | (char32_t(p[1] & 0x3F) << 12) |
             (char32_t(p[2] & 0x3F) << 6) | (p[3] & 0x3F);
  }
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  size_t i = 0;
  while (i < bytes.size()) {
    size_t len = 0;
    const Utf8Status st = classify_utf8(p + i, bytes.size() - i, len);
    if (st == Utf8Status::Complete) {
      out.append(bytes.substr(i, len));
    } else {
      out.append("\xEF\xBF\xBD");
    }
    i += len;
  }
  return out;
}

namespace {

struct ByteTables {
  std::array<char32_t, 256> to_cp{};
  std::array<int16_t, 324> from_cp{};  // code points 0..323 cover every symbol

  ByteTables() {
    from_cp.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      to_cp[b] = printable ? char32_t(b) : next++;
      from_cp[to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteTables& tables() {
  static const ByteTables t;
  return t;
}

}  // namespace

const std::array<char32_t, 256>& byte_to_cp() { return tables().to_cp; }

int cp_to_byte(char32_t cp) { return cp < 324 ? tables().from_cp[cp] : -1; }

}  // namespace dspark::tok::detail
