// AVX-512 level: the fp32 kernels (attention scores, softmax, value sums,
// norms, activations), generic/float_kernels.inl over one zmm register per
// 16-lane vector (vec16.hpp): the same operations per output as every level,
// half the AVX2 level's instructions.
#include <cmath>
#include <cstdint>

#pragma GCC diagnostic push
// GCC 12's AVX-512 headers trip -Wuninitialized inside their own shuffle
// intrinsics (the "undefined" pass-through operand); the code here is fine.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include "../../../level_kernels.hpp"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,f16c")
#include "vec16.hpp"

namespace dspark::ops::avx512 {
#include "../../../generic/float_kernels.inl"
}  // namespace dspark::ops::avx512

#pragma GCC pop_options
