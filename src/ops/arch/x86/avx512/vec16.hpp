// vec16.hpp — the AVX-512 level's 16-lane vector (internal): one zmm register
// with portable/vec16.hpp's semantics, so generic/float_kernels.inl computes
// the portable level's bits with half the AVX2 level's instructions. Include
// it after `#pragma GCC target("avx512f,avx512dq,...,avx2")` and <immintrin.h>.
#pragma once

#include <cstdint>

#include "../avx2/vec16.hpp"

namespace dspark::ops::avx512 {

struct Vec {
  using V = __m512;
  static __mmask16 first(int n) { return static_cast<__mmask16>((1u << n) - 1u); }  // n < 16
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V load_n(const float* p, int n) { return _mm512_maskz_loadu_ps(first(n), p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static void store_n(float* p, V v, int n) { _mm512_mask_storeu_ps(p, first(n), v); }
  static V keep_n(V v, int n) { return _mm512_maskz_mov_ps(first(n), v); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V zero() { return _mm512_setzero_ps(); }
  static V add(V x, V y) { return _mm512_add_ps(x, y); }
  static V sub(V x, V y) { return _mm512_sub_ps(x, y); }
  static V mul(V x, V y) { return _mm512_mul_ps(x, y); }
  static V div(V x, V y) { return _mm512_div_ps(x, y); }
  // vmaxps/vminps: x > y ? x : y and x < y ? x : y per lane, as the reference.
  static V max(V x, V y) { return _mm512_max_ps(x, y); }
  static V min(V x, V y) { return _mm512_min_ps(x, y); }
  static V round_even(V x) {
    const V m = _mm512_set1_ps(12582912.f);
    return _mm512_sub_ps(_mm512_add_ps(x, m), m);
  }
  static V pow2i(V n) {
    const __m512i e = _mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127));
    return _mm512_castsi512_ps(_mm512_slli_epi32(e, 23));
  }
  static V abs(V x) {
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff)));
  }
  static V copysign(V mag, V sign) {
    const __m512i s = _mm512_set1_epi32(static_cast<int>(0x80000000u));
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_andnot_si512(s, _mm512_castps_si512(mag)),
                                               _mm512_and_si512(s, _mm512_castps_si512(sign))));
  }
  // The reductions: the AVX2 level's on the two 8-lane halves (the same
  // tree16 additions).
  static avx2::Vec::V halves(V x) { return {_mm512_castps512_ps256(x), _mm512_extractf32x8_ps(x, 1)}; }
  static float hsum(V x) { return avx2::Vec::hsum(halves(x)); }
  static void halves8(const V* v, avx2::Vec::V* h) {
    for (int k = 0; k < 8; ++k) h[k] = halves(v[k]);
  }
  static void hsum8(const V* v, float* out) {
    avx2::Vec::V h[8];
    halves8(v, h);
    avx2::Vec::hsum8(h, out);
  }
  static void hsum8_scaled(const V* v, float scale, float* out) {
    avx2::Vec::V h[8];
    halves8(v, h);
    avx2::Vec::hsum8_scaled(h, scale, out);
  }
  static float hmax(V x) { return avx2::Vec::hmax(halves(x)); }
};

}  // namespace dspark::ops::avx512
