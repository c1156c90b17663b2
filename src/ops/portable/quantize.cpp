// Portable level: activation codes per 32 values (kernel_table.hpp's
// quantize32; ggml's quantize_row_q8_0 rule). Rounding to nearest even by
// adding and subtracting 1.5·2^23, so no library call is needed.
#include <cstdint>

#include "../level_kernels.hpp"

namespace dspark::ops::portable {

void quantize32(const float* v, int64_t nb, int8_t* codes, float* d) {
  for (int64_t b = 0; b < nb; ++b, v += 32, codes += 32) {
    float amax = 0.f;
    for (int j = 0; j < 32; ++j) {
      const float a = v[j] < 0.f ? -v[j] : v[j];
      amax = a > amax ? a : amax;
    }
    const float id = amax != 0.f ? 127.f / amax : 0.f;
    for (int j = 0; j < 32; ++j) codes[j] = static_cast<int8_t>(static_cast<int>((v[j] * id + 12582912.f) - 12582912.f));
    d[b] = amax / 127.f;
  }
}

}  // namespace dspark::ops::portable
