// Packing quantized weights into 16-row tiles; see qpack.hpp for the layout.
#include "qpack.hpp"

#include <ATen/Parallel.h>

#include <cstring>
#include <new>

#include "qdecode.hpp"

namespace dspark::ops::detail {

void AlignedFree::operator()(uint8_t* p) const { operator delete[](p, std::align_val_t{64}); }

namespace {

inline void put_u16(uint8_t* dst, const uint8_t* src) { std::memcpy(dst, src, 2); }

// Low nibbles of dword j from groups j, high nibbles from groups j + 8, of a
// pair's codes w in layout byte order.
void put_nibbles(uint8_t* nib, int r, const uint8_t* w) {
  for (int j = 0; j < 8; ++j)
    for (int e = 0; e < 4; ++e)
      nib[j * 64 + r * 4 + e] = static_cast<uint8_t>((w[4 * j + e] & 0x0F) | ((w[32 + 4 * j + e] & 0x0F) << 4));
}

template <QType T>
void pack_pair32(const uint8_t* row, int64_t p, bool half, int r, uint8_t* ch) {
  constexpr auto ti = kQTypeInfo[T];
  RowPair rp;
  decode_pair<T>(row, p, half, rp);
  uint8_t w[64];
  for (int e = 0; e < 64; ++e) w[byte_of(ti.layout, e)] = rp.el[e];
  const int64_t scales = T == kQ8_0 ? 1024 : T == kQ5_0 ? 640 : 512;
  for (int b = 0; b < (half ? 1 : 2); ++b) {
    const uint8_t* blk = row + (2 * p + b) * ti.block_bytes;
    put_u16(ch + scales + (b * 16 + r) * 2, blk);
    if constexpr (T == kQ4_1) put_u16(ch + scales + 64 + (b * 16 + r) * 2, blk + 2);
  }
  if constexpr (T == kQ8_0) {
    for (int g = 0; g < 16; ++g)
      for (int e = 0; e < 4; ++e) ch[g * 64 + r * 4 + e] = static_cast<uint8_t>(w[4 * g + e] ^ 0x80);
    return;
  }
  put_nibbles(ch, r, w);
  if constexpr (T == kQ5_0) {
    for (int k = 0; k < 2; ++k)
      for (int e = 0; e < 4; ++e) {
        uint8_t bits = 0;
        for (int j = 0; j < 8; ++j) bits = static_cast<uint8_t>(bits | (((w[32 * k + 4 * j + e] >> 4) & 1) << j));
        ch[512 + k * 64 + r * 4 + e] = bits;
      }
  }
}

void pack_q4k(const uint8_t* row, int64_t c, int r, uint8_t* ch) {
  const uint8_t* sb = row + c * 144;
  put_u16(ch + r * 2, sb);
  put_u16(ch + 32 + r * 2, sb + 2);
  for (int k = 0; k < 8; ++k) {
    int sc, mn;
    q4k_scale_min(sb + 4, k, sc, mn);
    ch[64 + k * 16 + r] = static_cast<uint8_t>(sc);
    ch[192 + k * 16 + r] = static_cast<uint8_t>(mn);
  }
  for (int j = 0; j < 4; ++j) {
    RowPair rp;
    decode_pair<kQ4_K>(row, 4 * c + j, false, rp);
    put_nibbles(ch + 320 + j * 512, r, rp.el);
  }
}

void pack_q6k(const uint8_t* row, int64_t c, int r, uint8_t* ch) {
  const uint8_t* sb = row + c * 210;
  put_u16(ch + r * 2, sb + 208);
  for (int k = 0; k < 16; ++k) ch[32 + k * 16 + r] = sb[192 + k];
  for (int j = 0; j < 4; ++j) {
    RowPair rp;
    decode_pair<kQ6_K>(row, 4 * c + j, false, rp);
    uint8_t* pj = ch + 288 + j * 768;
    put_nibbles(pj, r, rp.el);
    for (int k = 0; k < 4; ++k)
      for (int e = 0; e < 4; ++e) {
        uint8_t bits = 0;
        for (int m = 0; m < 4; ++m) bits = static_cast<uint8_t>(bits | (((rp.el[4 * (4 * k + m) + e] >> 4) & 3) << (2 * m)));
        pj[512 + k * 64 + r * 4 + e] = bits;
      }
  }
}

void pack_row(QType t, const uint8_t* row, int64_t cols, int r, uint8_t* tile) {
  const int64_t cb = chunk_bytes(t), nb32 = cols / 32;
  if (t == kQ4_K || t == kQ6_K) {
    for (int64_t c = 0; c < cols / 256; ++c) (t == kQ4_K ? pack_q4k : pack_q6k)(row, c, r, tile + c * cb);
    return;
  }
  for (int64_t p = 0; p < (nb32 + 1) / 2; ++p) {
    const bool half = 2 * p + 1 == nb32;
    uint8_t* ch = tile + p * cb;
    switch (t) {
      case kQ8_0: pack_pair32<kQ8_0>(row, p, half, r, ch); break;
      case kQ4_0: pack_pair32<kQ4_0>(row, p, half, r, ch); break;
      case kQ4_1: pack_pair32<kQ4_1>(row, p, half, r, ch); break;
      case kQ5_0: pack_pair32<kQ5_0>(row, p, half, r, ch); break;
      default: break;
    }
  }
}

}  // namespace

PackedQ pack_q(QType t, const uint8_t* raw, int64_t rows, int64_t cols, int64_t row_bytes) {
  const int64_t chunks = (cols + chunk_values(t) - 1) / chunk_values(t);
  PackedQ P;
  P.tile_bytes = (chunks * chunk_bytes(t) + 63) / 64 * 64;
  P.tiles = (rows + kTileRows - 1) / kTileRows;
  const auto bytes = static_cast<size_t>(P.tile_bytes * P.tiles);
  P.data.reset(new (std::align_val_t{64}) uint8_t[bytes]);
  at::parallel_for(0, P.tiles, 16, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      uint8_t* tile = P.data.get() + i * P.tile_bytes;
      std::memset(tile, 0, static_cast<size_t>(P.tile_bytes));
      for (int r = 0; r < kTileRows && i * kTileRows + r < rows; ++r)
        pack_row(t, raw + (i * kTileRows + r) * row_bytes, cols, r, tile);
    }
  });
  return P;
}

}  // namespace dspark::ops::detail
