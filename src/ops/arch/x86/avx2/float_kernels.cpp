// AVX2 level: the fp32 kernels, generic/float_kernels.inl over two ymm
// registers per 16-lane vector (vec16.hpp).
#include <cmath>
#include <cstdint>

#include "../../../level_kernels.hpp"

#pragma GCC push_options
#pragma GCC target("avx2,f16c")
#include "vec16.hpp"

namespace dspark::ops::avx2 {
#include "../../../generic/float_kernels.inl"
}  // namespace dspark::ops::avx2

#pragma GCC pop_options
