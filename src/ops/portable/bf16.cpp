// Portable level: bf16 products (kernel_table.hpp's bf16_block): 16 partial
// sums per dot product, lane l over k = l, l+16, ..., combined by tree16.
#include <cstdint>
#include <cstring>

#include "../level_kernels.hpp"

namespace dspark::ops::portable {

namespace {

inline float widen(uint16_t v) {
  const uint32_t u = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

void bf16_block(const uint16_t* x, int64_t N, const uint16_t* W, int rows, int64_t K, float* y, int64_t ldy,
                const uint16_t*) {
  for (int r = 0; r < rows; ++r) {
    const uint16_t* w = W + r * K;
    for (int64_t n = 0; n < N; ++n) {
      const uint16_t* xv = x + n * K;
      float part[16] = {};
      for (int64_t k = 0; k < K; k += 16)
        for (int l = 0; l < 16; ++l) part[l] = part[l] + widen(w[k + l]) * widen(xv[k + l]);
      for (int s = 8; s > 0; s /= 2)
        for (int l = 0; l < s; ++l) part[l] = part[l] + part[l + s];
      y[n * ldy + r] = part[0];
    }
  }
}

}  // namespace dspark::ops::portable
