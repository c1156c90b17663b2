// AVX2 level: activation codes per 32 values (kernel_table.hpp's quantize32).
// vcvtps2dq rounds to nearest even in the default rounding mode, as the
// reference's 1.5·2^23 addition does, so the codes are the same.
#include <immintrin.h>

#include <cstdint>

#include "../../../level_kernels.hpp"

#pragma GCC push_options
#pragma GCC target("avx2,f16c")

namespace dspark::ops::avx2 {

void quantize32(const float* v, int64_t nb, int8_t* codes, float* d) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t b = 0; b < nb; ++b, v += 32, codes += 32) {
    __m256 a[4];
    for (int i = 0; i < 4; ++i) a[i] = _mm256_loadu_ps(v + 8 * i);
    const __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(a[0], abs_mask), _mm256_and_ps(a[1], abs_mask)),
                                   _mm256_max_ps(_mm256_and_ps(a[2], abs_mask), _mm256_and_ps(a[3], abs_mask)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1)));
    const __m256 id = _mm256_set1_ps(amax != 0.f ? 127.f / amax : 0.f);
    __m256i q[4];
    for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(a[i], id));
    const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes), _mm256_permutevar8x32_epi32(packed, order));
    d[b] = amax / 127.f;
  }
}

}  // namespace dspark::ops::avx2

#pragma GCC pop_options
