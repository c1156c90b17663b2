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

// One dot product in the fold order of qmatmul.hpp: per unit u of each pair,
// I = Σ q·x_q - (offset)·s exactly, acc = acc + I·(dw·dx), accm = accm + mw·(dx·s).
template <QType T>
float dot_row(const uint8_t* row, int64_t n_blocks32, const XPair* x) {
  constexpr auto ti = kQTypeInfo[T];
  constexpr int U = detail::units_of(ti.layout);
  const int64_t n_pairs = (n_blocks32 + 1) / 2;
  float acc = 0.f, accm = 0.f;
  RowPair w;
  uint8_t wq[64];
  for (int64_t p = 0; p < n_pairs; ++p) {
    const bool half = 2 * p + 1 == n_blocks32;
    decode_pair<T>(row, p, half, w);
    for (int e = 0; e < 64; ++e) wq[detail::byte_of(ti.layout, e)] = w.el[e];
    const XPair& a = x[p];
    int32_t isum[4] = {0, 0, 0, 0};
    for (int g = 0; g < 16; ++g) {
      int32_t s = 0;
      for (int i = 4 * g; i < 4 * g + 4; ++i) s += static_cast<int32_t>(wq[i]) * a.q[i];
      isum[detail::unit_of_group(ti.layout, g)] += s;
    }
    const int units = half ? U / 2 : U;
    for (int u = 0; u < units; ++u) {
      const int32_t i = isum[u] - (ti.shift ? a.s[u] * (1 << ti.shift) : 0);
      acc = acc + static_cast<float>(i) * (w.dw[u] * a.dx[u]);
      if constexpr (ti.float_min) accm = accm + w.mw[u] * a.sdx[u];
    }
  }
  return acc + accm;
}

template <QType T>
void tile(const detail::QTile& t, const XPair* const* x, int64_t N, int64_t n_blocks32, float* y, int64_t ldy,
          float*) {
  for (int64_t n = 0; n < N; ++n)
    for (int r = 0; r < t.rows; ++r) y[n * ldy + r] = dot_row<T>(t.raw + r * t.row_bytes, n_blocks32, x[n]);
}

}  // namespace

DSPARK_DEFINE_QTILES(tile)

}  // namespace dspark::ops::portable
