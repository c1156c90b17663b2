// Portable level: the fp32 kernels, generic/float_kernels.inl over the
// reference 16-lane vector (vec16.hpp).
#include <cmath>
#include <cstdint>

#include "../level_kernels.hpp"
#include "vec16.hpp"

namespace dspark::ops::portable {
#include "../generic/float_kernels.inl"
}  // namespace dspark::ops::portable
