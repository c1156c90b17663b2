// NEON level: quantized tiles on packed weights (src/ops/qpack.hpp) with the
// dot-product extension's sdot (qgemm.inl).
#include <arm_neon.h>

#include <cstdint>
#include <cstring>

#include "../../../level_kernels.hpp"
#include "../../../qformat.hpp"
#include "../../../qpack.hpp"

#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod")

namespace dspark::ops::neon {
constexpr bool kI8mm = false;
#include "qgemm.inl"
}  // namespace dspark::ops::neon

#pragma GCC pop_options
