// Rotary position embedding; see include/dspark/ops/rope.hpp.
#include "dspark/ops/rope.hpp"

#include <cmath>

#include "dspark/ops/kernels.hpp"

namespace dspark::ops {

std::vector<float> rope_inv_freq(double base, int64_t rot_dim, double linear_scale, const float* factors) {
  std::vector<float> f(static_cast<size_t>(rot_dim / 2));
  for (int64_t i = 0; i < rot_dim / 2; ++i) {
    const double factor = factors ? static_cast<double>(factors[i]) : 1.0;
    f[static_cast<size_t>(i)] = static_cast<float>(
        std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(rot_dim)) / linear_scale / factor);
  }
  return f;
}

void rope_halves(float* x, int64_t T, int64_t row_stride, int64_t n_heads, int64_t head_dim,
                 int64_t rot_dim, const int64_t* positions, const float* inv_freq) {
  // Interleave each head's halves into adjacent pairs, rotate them with
  // rope_pairs (the same angles and arithmetic), and write them back.
  const int64_t half = rot_dim / 2;
  std::vector<float> pairs(static_cast<size_t>(T * n_heads * rot_dim));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < n_heads; ++h) {
      const float* v = x + t * row_stride + h * head_dim;
      float* p = pairs.data() + (t * n_heads + h) * rot_dim;
      for (int64_t i = 0; i < half; ++i) p[2 * i] = v[i], p[2 * i + 1] = v[i + half];
    }
  rope_pairs(pairs.data(), T, n_heads * rot_dim, n_heads, rot_dim, rot_dim, positions, inv_freq);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + t * row_stride + h * head_dim;
      const float* p = pairs.data() + (t * n_heads + h) * rot_dim;
      for (int64_t i = 0; i < half; ++i) v[i] = p[2 * i], v[i + half] = p[2 * i + 1];
    }
}

}  // namespace dspark::ops
