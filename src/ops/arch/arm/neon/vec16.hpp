// vec16.hpp — the NEON level's 16-lane vector (internal): four 4-lane q
// registers, lanes 0-3, 4-7, 8-11, 12-15, with portable/vec16.hpp's semantics
// (max and min by compare-and-select, so a NaN or a signed zero picks the
// operand the reference picks).
#pragma once

#include <arm_neon.h>

#include <cstdint>

namespace dspark::ops::neon {

struct Vec {
  struct V {
    float32x4_t v[4];
  };
  template <class F>
  static V each(const V& a, const V& b, F f) {
    return {{f(a.v[0], b.v[0]), f(a.v[1], b.v[1]), f(a.v[2], b.v[2]), f(a.v[3], b.v[3])}};
  }
  static V load(const float* p) { return {{vld1q_f32(p), vld1q_f32(p + 4), vld1q_f32(p + 8), vld1q_f32(p + 12)}}; }
  static V load_n(const float* p, int n) {
    float t[16] = {};
    for (int i = 0; i < n; ++i) t[i] = p[i];
    return load(t);
  }
  static void store(float* p, const V& a) {
    for (int i = 0; i < 4; ++i) vst1q_f32(p + 4 * i, a.v[i]);
  }
  static void store_n(float* p, const V& a, int n) {
    float t[16];
    store(t, a);
    for (int i = 0; i < n; ++i) p[i] = t[i];
  }
  static V keep_n(V a, int n) {
    const int32_t iota[4] = {0, 1, 2, 3};
    const int32x4_t idx = vld1q_s32(iota);
    for (int i = 0; i < 4; ++i) {
      const uint32x4_t keep = vcltq_s32(vaddq_s32(idx, vdupq_n_s32(4 * i)), vdupq_n_s32(n));
      a.v[i] = vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(a.v[i]), keep));
    }
    return a;
  }
  static V set1(float x) { return {{vdupq_n_f32(x), vdupq_n_f32(x), vdupq_n_f32(x), vdupq_n_f32(x)}}; }
  static V zero() { return set1(0.f); }
  static V add(const V& a, const V& b) { return each(a, b, [](float32x4_t x, float32x4_t y) { return vaddq_f32(x, y); }); }
  static V sub(const V& a, const V& b) { return each(a, b, [](float32x4_t x, float32x4_t y) { return vsubq_f32(x, y); }); }
  static V mul(const V& a, const V& b) { return each(a, b, [](float32x4_t x, float32x4_t y) { return vmulq_f32(x, y); }); }
  static V div(const V& a, const V& b) { return each(a, b, [](float32x4_t x, float32x4_t y) { return vdivq_f32(x, y); }); }
  static V max(const V& a, const V& b) {
    return each(a, b, [](float32x4_t x, float32x4_t y) { return vbslq_f32(vcgtq_f32(x, y), x, y); });
  }
  static V min(const V& a, const V& b) {
    return each(a, b, [](float32x4_t x, float32x4_t y) { return vbslq_f32(vcltq_f32(x, y), x, y); });
  }
  static V round_even(const V& a) {
    const float32x4_t m = vdupq_n_f32(12582912.f);
    return each(a, a, [m](float32x4_t x, float32x4_t) { return vsubq_f32(vaddq_f32(x, m), m); });
  }
  static V pow2i(const V& n) {
    return each(n, n, [](float32x4_t x, float32x4_t) {
      const int32x4_t e = vaddq_s32(vcvtq_s32_f32(x), vdupq_n_s32(127));
      return vreinterpretq_f32_s32(vshlq_n_s32(e, 23));
    });
  }
  static V abs(const V& a) { return each(a, a, [](float32x4_t x, float32x4_t) { return vabsq_f32(x); }); }
  static V copysign(const V& mag, const V& sign) {
    const uint32x4_t s = vdupq_n_u32(0x80000000u);
    return each(mag, sign, [s](float32x4_t m, float32x4_t g) { return vbslq_f32(s, g, m); });
  }
  /// tree16: lanes l and l+8, then l and l+4, l and l+2, l and l+1.
  static float hsum(const V& a) {
    const float32x4_t c = vaddq_f32(vaddq_f32(a.v[0], a.v[2]), vaddq_f32(a.v[1], a.v[3]));
    const float32x4_t d = vaddq_f32(c, vextq_f32(c, c, 2));
    return vgetq_lane_f32(d, 0) + vgetq_lane_f32(d, 1);
  }
  static float hmax(const V& a) {
    float t[16];
    store(t, a);
    float r = t[0];
    for (int i = 1; i < 16; ++i) r = t[i] > r ? t[i] : r;
    return r;
  }
};

}  // namespace dspark::ops::neon
