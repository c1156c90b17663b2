// Elementwise activations; see include/dspark/ops/activations.hpp.
#include "dspark/ops/activations.hpp"

#include <ATen/Parallel.h>

#include <cmath>

namespace dspark::ops {

float gelu_tanh(float x) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  return 0.5f * x * (1.f + std::tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
}

void gelu_tanh_mul(const float* gu, int64_t N, int64_t F, float* out) {
  at::parallel_for(0, N * F, 2048, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t n = i / F, f = i % F;
      out[i] = gelu_tanh(gu[n * 2 * F + f]) * gu[n * 2 * F + F + f];
    }
  });
}

void softcap(float* x, int64_t n, float cap) {
  if (!(cap > 0)) return;
  const float inv = 1.f / cap;
  at::parallel_for(0, n, 16384, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) x[i] = cap * std::tanh(x[i] * inv);
  });
}

void scale(float* x, int64_t n, float s) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

}  // namespace dspark::ops
