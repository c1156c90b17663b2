// AVX-512 level: bf16 products (kernel_table.hpp's bf16_block). A dot
// product's 16 lanes (k mod 16) are the 16 lanes of one zmm accumulator;
// bf16 values widen exactly to fp32 by a 16-bit shift, and each product is a
// multiply then an add (no fused multiply-add: -ffp-contract=off), so every
// output has portable/bf16.cpp's bits. Tiles of up to 4 weight rows x 4
// activation rows keep 16 accumulators in registers, so each widened weight
// serves 4 products and each widened activation 4 rows: twice the AVX2
// level's lanes per instruction and half its loads per product.
#include <algorithm>
#include <cstdint>

#pragma GCC diagnostic push
// GCC 12's AVX-512 headers trip -Wuninitialized inside their own shuffle
// intrinsics (the "undefined" pass-through operand); the code here is fine.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include "../../../level_kernels.hpp"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,f16c")

namespace dspark::ops::avx512 {

namespace {

inline __m512 widen16(const uint16_t* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

// tree16 of the 16 lanes: l + l+8, then l+4, l+2, l+1 (portable/vec16.hpp).
inline float tree16(__m512 v) {
  const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

// R weight rows x C activation rows over all of K.
template <int R, int C>
inline void tile(const uint16_t* x, const uint16_t* W, int64_t K, float* y, int64_t ldy, const uint16_t* next) {
  __m512 acc[R][C];
  for (auto& row : acc)
    for (auto& a : row) a = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) {
    if (next && k % 32 == 0)
      for (int r = 0; r < R; ++r) _mm_prefetch(reinterpret_cast<const char*>(next + r * K + k), _MM_HINT_T0);
    __m512 xv[C];
    for (int c = 0; c < C; ++c) xv[c] = widen16(x + c * K + k);
    for (int r = 0; r < R; ++r) {
      const __m512 w = widen16(W + r * K + k);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_add_ps(acc[r][c], _mm512_mul_ps(w, xv[c]));
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[c * ldy + r] = tree16(acc[r][c]);
}

// Weight rows [0, rows) in tiles of 4, 2, 1 for C activation rows.
template <int C>
inline void rows_tiles(const uint16_t* x, const uint16_t* W, int rows, int64_t K, float* y, int64_t ldy,
                       const uint16_t* next) {
  int r = 0;
  for (; r + 4 <= rows; r += 4) tile<4, C>(x, W + r * K, K, y + r, ldy, next ? next + r * K : nullptr);
  for (; r + 2 <= rows; r += 2) tile<2, C>(x, W + r * K, K, y + r, ldy, nullptr);
  for (; r < rows; ++r) tile<1, C>(x, W + r * K, K, y + r, ldy, nullptr);
}

}  // namespace

void bf16_block(const uint16_t* x, int64_t N, const uint16_t* W, int rows, int64_t K, float* y, int64_t ldy,
                const uint16_t* next) {
  for (int64_t n = 0; n < N; n += 4) {
    const uint16_t* xn = x + n * K;
    float* yn = y + n * ldy;
    const uint16_t* pf = n == 0 ? next : nullptr;  // the next block's rows, fetched during the first pass
    switch (std::min<int64_t>(4, N - n)) {
      case 1: rows_tiles<1>(xn, W, rows, K, yn, ldy, pf); break;
      case 2: rows_tiles<2>(xn, W, rows, K, yn, ldy, pf); break;
      case 3: rows_tiles<3>(xn, W, rows, K, yn, ldy, pf); break;
      default: rows_tiles<4>(xn, W, rows, K, yn, ldy, pf); break;
    }
  }
}

}  // namespace dspark::ops::avx512

#pragma GCC pop_options
