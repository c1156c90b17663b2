// Portable level: quantized tiles, one (weight row, activation row) product
// at a time, straight from the GGUF blocks — the reference the SIMD levels
// are tested against bit for bit (include/dspark/ops/qmatmul.hpp).
#include <cstdint>
#include <cstring>

#include "../level_kernels.hpp"
#include "../qdecode.hpp"

namespace dspark::ops::portable {

namespace {

using detail::decode_pair;
using detail::kQTypeInfo;
using detail::QType;
using detail::RowPair;
using detail::XPair;

// Pair p of a row as unsigned codes in the layout's byte order (qformat.hpp)
// and per-unit scales. The 32-block types are read straight into that order
// (nibble32 is the order of their packed bytes); the K-quants' order is the
// natural one decode_pair writes. Bytes of a missing last block are left as
// they are: its unit is not folded.
template <QType T>
inline void decode_layout(const uint8_t* row, int64_t p, bool half, RowPair& w, uint8_t* wq) {
  constexpr auto ti = kQTypeInfo[T];
  if constexpr (T == detail::kQ4_K || T == detail::kQ6_K) {
    decode_pair<T>(row, p, half, w);
    std::memcpy(wq, w.el, 64);
  } else {
    for (int b = 0; b < (half ? 1 : 2); ++b) {
      const uint8_t* blk = row + (2 * p + b) * ti.block_bytes;
      w.dw[b] = detail::f16(blk);
      if constexpr (T == detail::kQ8_0) {
        for (int j = 0; j < 32; ++j) wq[32 * b + j] = static_cast<uint8_t>(blk[2 + j] ^ 0x80);
      } else {
        constexpr int off = T == detail::kQ4_1 ? 4 : T == detail::kQ5_0 ? 6 : 2;
        const uint32_t qh = T == detail::kQ5_0 ? detail::load_u32(blk + 2) : 0;
        for (int j = 0; j < 16; ++j) {
          wq[16 * b + j] = static_cast<uint8_t>((blk[off + j] & 0x0F) | (((qh >> j) & 1) << 4));
          wq[32 + 16 * b + j] = static_cast<uint8_t>((blk[off + j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
        }
      }
      if constexpr (T == detail::kQ4_1) w.mw[b] = detail::f16(blk + 2);
    }
  }
}

// Each weight row's pairs are decoded once and used for every activation row.
// Per (weight row, activation row), in the fold order of qmatmul.hpp: per unit
// u of each pair, I = Σ q·x_q - (offset)·s exactly, acc = acc + I·(dw·dx),
// accm = accm + mw·(dx·s); y = acc + accm. `scratch`: 2·N floats.
template <QType T>
void tile(const detail::QTile& t, const XPair* const* x, int64_t N, int64_t n_blocks32, float* y, int64_t ldy,
          float* scratch) {
  constexpr auto ti = kQTypeInfo[T];
  constexpr int U = detail::units_of(ti.layout);
  const int64_t n_pairs = (n_blocks32 + 1) / 2;
  RowPair w;
  uint8_t wq[64];
  // Units of the four 16-byte quarters of a pair in the layout's byte order.
  int unit[4];
  for (int q = 0; q < 4; ++q) unit[q] = detail::unit_of_group(ti.layout, 4 * q);
  for (int r = 0; r < t.rows; ++r) {
    const uint8_t* row = t.raw + r * t.row_bytes;
    for (int64_t i = 0; i < 2 * N; ++i) scratch[i] = 0.f;
    for (int64_t p = 0; p < n_pairs; ++p) {
      const bool half = 2 * p + 1 == n_blocks32;
      decode_layout<T>(row, p, half, w, wq);
      const int units = half ? U / 2 : U;
      for (int64_t n = 0; n < N; ++n) {
        const XPair& a = x[n][p];
        int32_t isum[4] = {0, 0, 0, 0};
        for (int q = 0; q < 4; ++q) {
          int32_t s = 0;
          for (int i = 16 * q; i < 16 * q + 16; ++i) s += static_cast<int32_t>(wq[i]) * a.q[i];
          isum[unit[q]] += s;
        }
        float acc = scratch[2 * n], accm = scratch[2 * n + 1];
        for (int u = 0; u < units; ++u) {
          const int32_t i = isum[u] - (ti.shift ? a.s[u] * (1 << ti.shift) : 0);
          acc = acc + static_cast<float>(i) * (w.dw[u] * a.dx[u]);
          if constexpr (ti.float_min) accm = accm + w.mw[u] * a.sdx[u];
        }
        scratch[2 * n] = acc;
        scratch[2 * n + 1] = accm;
      }
    }
    for (int64_t n = 0; n < N; ++n) y[n * ldy + r] = scratch[2 * n] + scratch[2 * n + 1];
  }
}

}  // namespace

DSPARK_DEFINE_QTILES(tile)

}  // namespace dspark::ops::portable
