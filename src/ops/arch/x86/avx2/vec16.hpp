// vec16.hpp — the AVX2 level's 16-lane vector (internal): two 8-lane ymm
// registers, lanes 0-7 and 8-15, with portable/vec16.hpp's semantics. Include
// it after `#pragma GCC target("avx2,f16c")`.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace dspark::ops::avx2 {

struct Vec {
  struct V {
    __m256 a, b;  // lanes 0-7, 8-15
  };
  static V load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static V load_n(const float* p, int n) {
    alignas(32) float t[16] = {};
    for (int i = 0; i < n; ++i) t[i] = p[i];
    return {_mm256_load_ps(t), _mm256_load_ps(t + 8)};
  }
  static void store(float* p, V v) {
    _mm256_storeu_ps(p, v.a);
    _mm256_storeu_ps(p + 8, v.b);
  }
  static void store_n(float* p, V v, int n) {
    alignas(32) float t[16];
    _mm256_store_ps(t, v.a);
    _mm256_store_ps(t + 8, v.b);
    for (int i = 0; i < n; ++i) p[i] = t[i];
  }
  static V keep_n(V v, int n) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), vn = _mm256_set1_epi32(n);
    const __m256 ka = _mm256_castsi256_ps(_mm256_cmpgt_epi32(vn, idx));
    const __m256 kb = _mm256_castsi256_ps(_mm256_cmpgt_epi32(vn, _mm256_add_epi32(idx, _mm256_set1_epi32(8))));
    return {_mm256_and_ps(v.a, ka), _mm256_and_ps(v.b, kb)};
  }
  static V set1(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
  static V zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static V add(V x, V y) { return {_mm256_add_ps(x.a, y.a), _mm256_add_ps(x.b, y.b)}; }
  static V sub(V x, V y) { return {_mm256_sub_ps(x.a, y.a), _mm256_sub_ps(x.b, y.b)}; }
  static V mul(V x, V y) { return {_mm256_mul_ps(x.a, y.a), _mm256_mul_ps(x.b, y.b)}; }
  static V div(V x, V y) { return {_mm256_div_ps(x.a, y.a), _mm256_div_ps(x.b, y.b)}; }
  // maxps/minps: x > y ? x : y and x < y ? x : y per lane, as the reference.
  static V max(V x, V y) { return {_mm256_max_ps(x.a, y.a), _mm256_max_ps(x.b, y.b)}; }
  static V min(V x, V y) { return {_mm256_min_ps(x.a, y.a), _mm256_min_ps(x.b, y.b)}; }
  static V round_even(V x) {
    const __m256 m = _mm256_set1_ps(12582912.f);
    return {_mm256_sub_ps(_mm256_add_ps(x.a, m), m), _mm256_sub_ps(_mm256_add_ps(x.b, m), m)};
  }
  static __m256 pow2i8(__m256 n) {
    const __m256i e = _mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127));
    return _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
  }
  static V pow2i(V n) { return {pow2i8(n.a), pow2i8(n.b)}; }
  static V abs(V x) {
    const __m256 m = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    return {_mm256_and_ps(x.a, m), _mm256_and_ps(x.b, m)};
  }
  static V copysign(V mag, V sign) {
    const __m256 s = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(0x80000000u)));
    return {_mm256_or_ps(_mm256_andnot_ps(s, mag.a), _mm256_and_ps(s, sign.a)),
            _mm256_or_ps(_mm256_andnot_ps(s, mag.b), _mm256_and_ps(s, sign.b))};
  }
  /// tree16 of a 16-lane value held as two 8-lane halves.
  static float hsum8x2(__m256 lo, __m256 hi) {
    const __m256 s8 = _mm256_add_ps(lo, hi);                                           // l, l+8
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));  // l, l+4
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));                           // l, l+2
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));                   // l, l+1
  }
  static float hsum(V x) { return hsum8x2(x.a, x.b); }
  /// out[k] = hsum(v[k]) for k < 8, the 8 trees side by side: the same
  /// pairs added (l + l+8, then l+4, l+2, l+1) after transposing 128-bit
  /// halves and shuffling lanes.
  static __m256 hsum8v(const V* v) {
    __m256 s4[4];
    for (int k = 0; k < 8; k += 2) {
      const __m256 a = _mm256_add_ps(v[k].a, v[k].b), b = _mm256_add_ps(v[k + 1].a, v[k + 1].b);  // l, l+8
      s4[k / 2] = _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));  // l, l+4
    }
    // Per 128-bit lane: [k, k, k+2, k+2] sums of l, l+2 (low lane even k, high lane odd k).
    const __m256 s2a = _mm256_add_ps(_mm256_shuffle_ps(s4[0], s4[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                     _mm256_shuffle_ps(s4[0], s4[1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m256 s2b = _mm256_add_ps(_mm256_shuffle_ps(s4[2], s4[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                     _mm256_shuffle_ps(s4[2], s4[3], _MM_SHUFFLE(3, 2, 3, 2)));
    // l, l+1: keys 0 2 4 6 | 1 3 5 7, then back in order.
    const __m256 s1 = _mm256_add_ps(_mm256_shuffle_ps(s2a, s2b, _MM_SHUFFLE(2, 0, 2, 0)),
                                    _mm256_shuffle_ps(s2a, s2b, _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm256_permutevar8x32_ps(s1, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  }
  static void hsum8(const V* v, float* out) { _mm256_storeu_ps(out, hsum8v(v)); }
  /// out[k] = hsum(v[k]) · scale for k < 8 (the products in registers: a
  /// store of the sums then a reload would wait on store forwarding).
  static void hsum8_scaled(const V* v, float scale, float* out) {
    _mm256_storeu_ps(out, _mm256_mul_ps(hsum8v(v), _mm256_set1_ps(scale)));
  }
  static float hmax(V x) {
    const __m256 m8 = _mm256_max_ps(x.a, x.b);
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
  }
};

}  // namespace dspark::ops::avx2
