// simd_reduce.hpp — the one fixed horizontal-sum order of the CPU kernels
// (internal header).
//
// A dot product accumulated in the 16 lanes of a zmm register is finished by
// one pairwise tree: lanes l and l+8, then l and l+4, l and l+2, l and l+1.
// hsum16 applies it to one register; reduce16 applies it to 16 registers at
// once with shuffles. Both give the same bits for a given register, so a
// result does not depend on how many dot products shared a tile.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#pragma GCC diagnostic push
// GCC 12's AVX-512 headers trip -Wuninitialized inside their own shuffle
// intrinsics (the "undefined" pass-through operand); the code here is fine.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

namespace dspark::ops::simd {

/// The tree on 16 values in place; returns the sum (portable reference of hsum16).
inline float tree16(float* t) {
  for (int s = 8; s > 0; s /= 2)
    for (int l = 0; l < s; ++l) t[l] += t[l + s];
  return t[0];
}

/// Horizontal sum of 16 lanes in the fixed pairwise order.
__attribute__((target("avx512f"))) inline float hsum16(__m512 v) {
  alignas(64) float t[16];
  _mm512_store_ps(t, v);
  return tree16(t);
}

/// Reduces v[0..15] to one vector whose lane lane_of(a) holds the tree sum of v[a].
__attribute__((target("avx512f"))) inline __m512 reduce16(const __m512* v) {
  __m512 c[8], e[4], g[2];
  for (int i = 0; i < 8; ++i)
    c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; ++i)
    e[i] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], 0xDD));
  for (int i = 0; i < 2; ++i)
    g[i] = _mm512_add_ps(_mm512_shuffle_ps(e[2 * i], e[2 * i + 1], 0x44),
                         _mm512_shuffle_ps(e[2 * i], e[2 * i + 1], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_ps(g[0], g[1], 0x88), _mm512_shuffle_ps(g[0], g[1], 0xDD));
}

/// Softmax numerator of one attention row in place, in one fixed order:
/// p[j] = exp(p[j] - max(p)) for j < L; returns their sum (sequential).
inline float exp_shifted(float* p, int64_t L) {
  float mx = -INFINITY;
  for (int64_t j = 0; j < L; ++j) mx = std::max(mx, p[j]);
  float sum = 0.f;
  for (int64_t j = 0; j < L; ++j) {
    p[j] = std::exp(p[j] - mx);
    sum += p[j];
  }
  return sum;
}

/// Lane of reduce16's result that holds accumulator a.
constexpr int lane_of(int a) { return 4 * (a % 4) + a / 4; }

}  // namespace dspark::ops::simd
