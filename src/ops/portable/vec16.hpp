// vec16.hpp — the portable level's 16-lane vector (internal): the reference
// semantics of every level's Vec (src/ops/generic/float_kernels.inl). Plain
// loops over 16 floats, which compilers vectorize for whatever the target has.
#pragma once

#include <cstdint>
#include <cstring>

namespace dspark::ops::portable {

struct Vec {
  struct V {
    float v[16];
  };
  static V load(const float* p) {
    V r;
    for (int i = 0; i < 16; ++i) r.v[i] = p[i];
    return r;
  }
  static V load_n(const float* p, int n) {
    V r = zero();
    for (int i = 0; i < n; ++i) r.v[i] = p[i];
    return r;
  }
  static void store(float* p, const V& a) {
    for (int i = 0; i < 16; ++i) p[i] = a.v[i];
  }
  static void store_n(float* p, const V& a, int n) {
    for (int i = 0; i < n; ++i) p[i] = a.v[i];
  }
  static V keep_n(V a, int n) {
    for (int i = n; i < 16; ++i) a.v[i] = 0.f;
    return a;
  }
  static V set1(float x) {
    V r;
    for (float& e : r.v) e = x;
    return r;
  }
  static V zero() { return set1(0.f); }
  template <class F>
  static V zip(const V& a, const V& b, F f) {
    V r;
    for (int i = 0; i < 16; ++i) r.v[i] = f(a.v[i], b.v[i]);
    return r;
  }
  static V add(const V& a, const V& b) { return zip(a, b, [](float x, float y) { return x + y; }); }
  static V sub(const V& a, const V& b) { return zip(a, b, [](float x, float y) { return x - y; }); }
  static V mul(const V& a, const V& b) { return zip(a, b, [](float x, float y) { return x * y; }); }
  static V div(const V& a, const V& b) { return zip(a, b, [](float x, float y) { return x / y; }); }
  static V max(const V& a, const V& b) { return zip(a, b, [](float x, float y) { return x > y ? x : y; }); }
  static V min(const V& a, const V& b) { return zip(a, b, [](float x, float y) { return x < y ? x : y; }); }
  /// Round to nearest even by adding and subtracting 1.5·2^23 (|x| < 2^22).
  static V round_even(const V& a) {
    return zip(a, a, [](float x, float) { return (x + 12582912.f) - 12582912.f; });
  }
  static V pow2i(const V& n) {
    return zip(n, n, [](float x, float) {
      const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(x) + 127) << 23;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    });
  }
  static float with_bits(float x, uint32_t keep, uint32_t from_y, float y) {
    uint32_t a, b;
    std::memcpy(&a, &x, 4);
    std::memcpy(&b, &y, 4);
    a = (a & keep) | (b & from_y);
    std::memcpy(&x, &a, 4);
    return x;
  }
  static V abs(const V& a) {
    return zip(a, a, [](float x, float) { return with_bits(x, 0x7fffffffu, 0u, 0.f); });
  }
  static V copysign(const V& mag, const V& sign) {
    return zip(mag, sign, [](float x, float y) { return with_bits(x, 0x7fffffffu, 0x80000000u, y); });
  }
  /// tree16: lanes l and l+8, then l and l+4, l and l+2, l and l+1.
  static float hsum(V a) {
    for (int s = 8; s > 0; s /= 2)
      for (int l = 0; l < s; ++l) a.v[l] = a.v[l] + a.v[l + s];
    return a.v[0];
  }
  static float hmax(const V& a) {
    float m = a.v[0];
    for (int i = 1; i < 16; ++i) m = a.v[i] > m ? a.v[i] : m;
    return m;
  }
};

}  // namespace dspark::ops::portable
