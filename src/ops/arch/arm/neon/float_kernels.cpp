// NEON level: the fp32 kernels, generic/float_kernels.inl over four q
// registers per 16-lane vector (vec16.hpp). Advanced SIMD is part of aarch64,
// so no target selection is needed here.
#include <cmath>
#include <cstdint>

#include "../../../level_kernels.hpp"
#include "vec16.hpp"

namespace dspark::ops::neon {
#include "../../../generic/float_kernels.inl"
}  // namespace dspark::ops::neon
