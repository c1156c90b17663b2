// NEON level: activation codes per 32 values (kernel_table.hpp's quantize32).
// vcvtnq rounds to nearest even, as the reference does.
#include <arm_neon.h>

#include <cstdint>

#include "../../../level_kernels.hpp"

namespace dspark::ops::neon {

void quantize32(const float* v, int64_t nb, int8_t* codes, float* d) {
  for (int64_t b = 0; b < nb; ++b, v += 32, codes += 32) {
    float32x4_t a[8];
    float32x4_t m = vdupq_n_f32(0.f);
    for (int i = 0; i < 8; ++i) {
      a[i] = vld1q_f32(v + 4 * i);
      m = vmaxq_f32(m, vabsq_f32(a[i]));
    }
    const float amax = vmaxvq_f32(m);
    const float32x4_t id = vdupq_n_f32(amax != 0.f ? 127.f / amax : 0.f);
    for (int i = 0; i < 8; i += 2) {
      const int16x8_t s16 = vcombine_s16(vqmovn_s32(vcvtnq_s32_f32(vmulq_f32(a[i], id))),
                                         vqmovn_s32(vcvtnq_s32_f32(vmulq_f32(a[i + 1], id))));
      vst1_s8(codes + 4 * i, vqmovn_s16(s16));
    }
    d[b] = amax / 127.f;
  }
}

}  // namespace dspark::ops::neon
