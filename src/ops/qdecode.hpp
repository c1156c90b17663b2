// qdecode.hpp — one 64-value pair of a GGUF weight row decoded to unsigned
// codes and per-unit scales, w = dw·q + mw (internal; the reference decoding
// of the portable kernels and of the packer, qpack.cpp).
#pragma once

#include <cstdint>
#include <cstring>

#include "dspark/io/dequant.hpp"
#include "qformat.hpp"

namespace dspark::ops::detail {

inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline float f16(const uint8_t* p) { return io::half_to_float(static_cast<uint16_t>(p[0] | (p[1] << 8))); }

// Unpacks the 6-bit scale and min of Q4_K sub-block k (0..7).
inline void q4k_scale_min(const uint8_t* s, int k, int& sc, int& mn) {
  if (k < 4) {
    sc = s[k] & 63;
    mn = s[k + 4] & 63;
  } else {
    sc = (s[k + 4] & 0x0F) | ((s[k - 4] >> 6) << 4);
    mn = (s[k + 4] >> 4) | ((s[k] >> 6) << 4);
  }
}

// Pair p of a weight row: unsigned codes q in element order and per-unit
// scales (w = dw·q + mw). `half`: the row ends after block 2p.
struct RowPair {
  uint8_t el[64];
  float dw[4], mw[4];
};

template <QType T>
void decode_pair(const uint8_t* row, int64_t p, bool half, RowPair& o) {
  constexpr auto ti = kQTypeInfo[T];
  std::memset(&o, 0, sizeof o);
  if constexpr (T == kQ8_0 || T == kQ4_0 || T == kQ4_1 || T == kQ5_0) {
    for (int b = 0; b < (half ? 1 : 2); ++b) {
      const uint8_t* blk = row + (2 * p + b) * ti.block_bytes;
      o.dw[b] = f16(blk);
      uint8_t* e = o.el + 32 * b;
      if constexpr (T == kQ8_0) {
        for (int j = 0; j < 32; ++j) e[j] = static_cast<uint8_t>(blk[2 + j] ^ 0x80);
      } else {
        constexpr int off = T == kQ4_1 ? 4 : T == kQ5_0 ? 6 : 2;
        const uint32_t qh = T == kQ5_0 ? load_u32(blk + 2) : 0;
        for (int j = 0; j < 16; ++j) {
          e[j] = static_cast<uint8_t>((blk[off + j] & 0x0F) | (((qh >> j) & 1) << 4));
          e[j + 16] = static_cast<uint8_t>((blk[off + j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
        }
      }
      if constexpr (T == kQ4_1) o.mw[b] = f16(blk + 2);
    }
  } else if constexpr (T == kQ4_K) {
    const uint8_t* sb = row + (p / 4) * ti.block_bytes;
    const int j = static_cast<int>(p % 4);
    const float d = f16(sb), dmin = f16(sb + 2);
    const uint8_t* qs = sb + 16 + 32 * j;
    for (int l = 0; l < 32; ++l) {
      o.el[l] = qs[l] & 0x0F;
      o.el[l + 32] = qs[l] >> 4;
    }
    for (int b = 0; b < 2; ++b) {
      int sc, mn;
      q4k_scale_min(sb + 4, 2 * j + b, sc, mn);
      o.dw[b] = d * static_cast<float>(sc);
      o.mw[b] = -(dmin * static_cast<float>(mn));
    }
  } else {
    static_assert(T == kQ6_K);
    const uint8_t* sb = row + (p / 4) * ti.block_bytes;
    const int j4 = static_cast<int>(p % 4), h = j4 / 2, jj = j4 % 2;
    const uint8_t* ql = sb + 64 * h;
    const uint8_t* qh = sb + 128 + 32 * h;
    const auto* sc = reinterpret_cast<const int8_t*>(sb + 192 + 8 * h + 4 * jj);
    const float d = f16(sb + 208);
    const int s0 = 4 * jj, s1 = 4 * jj + 2;
    for (int l = 0; l < 32; ++l) {
      o.el[l] = static_cast<uint8_t>((jj ? ql[l] >> 4 : ql[l] & 0x0F) | (((qh[l] >> s0) & 3) << 4));
      o.el[l + 32] = static_cast<uint8_t>((jj ? ql[l + 32] >> 4 : ql[l + 32] & 0x0F) | (((qh[l] >> s1) & 3) << 4));
    }
    for (int u = 0; u < 4; ++u) o.dw[u] = d * static_cast<float>(sc[u]);
  }
}

}  // namespace dspark::ops::detail
