// AVX2 level: bf16 products (kernel_table.hpp's bf16_block). A dot product's
// 16 lanes are two ymm accumulators (k mod 16 in 0-7 and 8-15); bf16 values
// widen exactly to fp32 by a 16-bit shift, and each product is a multiply
// then an add, as the reference does. Tiles: 4 weight rows x 1 activation row
// when N = 1, 2 x 2 otherwise, so a loaded weight serves several products.
#include <immintrin.h>

#include <cstdint>

#include "../../../level_kernels.hpp"

#pragma GCC push_options
#pragma GCC target("avx2,f16c")
#include "vec16.hpp"

namespace dspark::ops::avx2 {

namespace {

struct W16 {
  __m256 a, b;
};
inline W16 widen16(const uint16_t* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return {_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(raw)), 16)),
          _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(raw, 1)), 16))};
}

// R weight rows x C activation rows over all of K.
template <int R, int C>
inline void tile(const uint16_t* x, const uint16_t* W, int64_t K, float* y, int64_t ldy, const uint16_t* next) {
  W16 acc[R][C];
  for (auto& row : acc)
    for (auto& a : row) a = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t k = 0; k < K; k += 16) {
    if (next && k % 32 == 0)
      for (int r = 0; r < R; ++r) _mm_prefetch(reinterpret_cast<const char*>(next + r * K + k), _MM_HINT_T0);
    W16 xv[C];
    for (int c = 0; c < C; ++c) xv[c] = widen16(x + c * K + k);
    for (int r = 0; r < R; ++r) {
      const W16 w = widen16(W + r * K + k);
      for (int c = 0; c < C; ++c) {
        acc[r][c].a = _mm256_add_ps(acc[r][c].a, _mm256_mul_ps(w.a, xv[c].a));
        acc[r][c].b = _mm256_add_ps(acc[r][c].b, _mm256_mul_ps(w.b, xv[c].b));
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[c * ldy + r] = Vec::hsum8x2(acc[r][c].a, acc[r][c].b);
}

}  // namespace

void bf16_block(const uint16_t* x, int64_t N, const uint16_t* W, int rows, int64_t K, float* y, int64_t ldy,
                const uint16_t* next) {
  if (N == 1) {
    int r = 0;
    for (; r + 4 <= rows; r += 4) tile<4, 1>(x, W + r * K, K, y + r, ldy, next ? next + r * K : nullptr);
    for (; r < rows; ++r) tile<1, 1>(x, W + r * K, K, y + r, ldy, nullptr);
    return;
  }
  for (int64_t n = 0; n < N; n += 2) {
    const bool pair = n + 1 < N;
    int r = 0;
    for (; r + 2 <= rows; r += 2) {
      const uint16_t* pf = n == 0 && next ? next + r * K : nullptr;
      if (pair) tile<2, 2>(x + n * K, W + r * K, K, y + n * ldy + r, ldy, pf);
      else tile<2, 1>(x + n * K, W + r * K, K, y + n * ldy + r, ldy, pf);
    }
    for (; r < rows; ++r) {
      if (pair) tile<1, 2>(x + n * K, W + r * K, K, y + n * ldy + r, ldy, nullptr);
      else tile<1, 1>(x + n * K, W + r * K, K, y + n * ldy + r, ldy, nullptr);
    }
  }
}

}  // namespace dspark::ops::avx2

#pragma GCC pop_options
