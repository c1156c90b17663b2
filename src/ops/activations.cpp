// Elementwise activations; see include/dspark/ops/activations.hpp. The
// arithmetic runs in the active kernel level's table (kernel_table.hpp).
#include "dspark/ops/activations.hpp"

#include <algorithm>

#include "kernel_table.hpp"
#include "parallel.hpp"

namespace dspark::ops {

float gelu_tanh(float x) {
  const float one = 1.f;
  float out;
  detail::active_kernels().gelu_tanh_mul(&x, &one, 1, &out);
  return out;
}

void gelu_tanh_mul(const float* gu, int64_t N, int64_t F, float* out) {
  const auto& kt = detail::active_kernels();
  const int64_t per_row = (F + 2047) / 2048;
  detail::parallel_tasks(0, N * per_row, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t n = i / per_row, f0 = (i % per_row) * 2048, nf = std::min<int64_t>(2048, F - f0);
      kt.gelu_tanh_mul(gu + n * 2 * F + f0, gu + n * 2 * F + F + f0, nf, out + n * F + f0);
    }
  });
}

void softcap(float* x, int64_t n, float cap) {
  if (!(cap > 0)) return;
  const auto& kt = detail::active_kernels();
  detail::parallel_tasks(0, n, 16384, [&](int64_t i0, int64_t i1) { kt.softcap(x + i0, i1 - i0, cap); });
}

void scale(float* x, int64_t n, float s) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

}  // namespace dspark::ops
