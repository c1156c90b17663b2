// Per-head RMSNorm; see include/dspark/ops/head_norm.hpp.
#include "dspark/ops/head_norm.hpp"

#include "dspark/ops/kernels.hpp"

namespace dspark::ops {

void head_rmsnorm(float* x, int64_t T, int64_t row_stride, int64_t n_heads, int64_t hd, const float* w,
                  float eps) {
  // The heads of one token are contiguous: one rmsnorm call over n_heads rows of hd.
  for (int64_t t = 0; t < T; ++t) rmsnorm_f32(x + t * row_stride, w, n_heads, hd, eps, x + t * row_stride);
}

}  // namespace dspark::ops
