// NEON level: bf16 products (kernel_table.hpp's bf16_block). A dot product's
// 16 lanes are four q accumulators; bf16 values widen exactly to fp32 by a
// 16-bit shift, and each product is a multiply then an add, as the reference
// does. Tiles: 4 weight rows x 1 activation row when N = 1, 2 x 2 otherwise.
#include <arm_neon.h>

#include <cstdint>

#include "../../../level_kernels.hpp"
#include "vec16.hpp"

namespace dspark::ops::neon {

namespace {

inline Vec::V widen16(const uint16_t* p) {
  const uint16x8_t lo = vld1q_u16(p), hi = vld1q_u16(p + 8);
  return {{vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(lo), 16)),
           vreinterpretq_f32_u32(vshll_n_u16(vget_high_u16(lo), 16)),
           vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(hi), 16)),
           vreinterpretq_f32_u32(vshll_n_u16(vget_high_u16(hi), 16))}};
}

template <int R, int C>
inline void tile(const uint16_t* x, const uint16_t* W, int64_t K, float* y, int64_t ldy) {
  Vec::V acc[R][C];
  for (auto& row : acc)
    for (auto& a : row) a = Vec::zero();
  for (int64_t k = 0; k < K; k += 16) {
    Vec::V xv[C];
    for (int c = 0; c < C; ++c) xv[c] = widen16(x + c * K + k);
    for (int r = 0; r < R; ++r) {
      const Vec::V w = widen16(W + r * K + k);
      for (int c = 0; c < C; ++c) acc[r][c] = Vec::add(acc[r][c], Vec::mul(w, xv[c]));
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[c * ldy + r] = Vec::hsum(acc[r][c]);
}

}  // namespace

void bf16_block(const uint16_t* x, int64_t N, const uint16_t* W, int rows, int64_t K, float* y, int64_t ldy,
                const uint16_t*) {
  if (N == 1) {
    int r = 0;
    for (; r + 4 <= rows; r += 4) tile<4, 1>(x, W + r * K, K, y + r, ldy);
    for (; r < rows; ++r) tile<1, 1>(x, W + r * K, K, y + r, ldy);
    return;
  }
  for (int64_t n = 0; n < N; n += 2) {
    const bool pair = n + 1 < N;
    for (int r = 0; r < rows; r += 2) {
      const bool two = r + 1 < rows;
      float* yo = y + n * ldy + r;
      if (pair && two) tile<2, 2>(x + n * K, W + r * K, K, yo, ldy);
      else if (pair) tile<1, 2>(x + n * K, W + r * K, K, yo, ldy);
      else if (two) tile<2, 1>(x + n * K, W + r * K, K, yo, ldy);
      else tile<1, 1>(x + n * K, W + r * K, K, yo, ldy);
    }
  }
}

}  // namespace dspark::ops::neon
