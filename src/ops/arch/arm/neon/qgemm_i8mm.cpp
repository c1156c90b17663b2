// NEON level on CPUs with the int8 matrix-multiply extension (i8mm): the
// quantized tiles of qgemm.inl with smmla for pairs of activation rows.
#include <arm_neon.h>

#include <cstdint>
#include <cstring>

#include "../../../level_kernels.hpp"
#include "../../../qformat.hpp"
#include "../../../qpack.hpp"

#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod+i8mm")

namespace dspark::ops::neoni8mm {
constexpr bool kI8mm = true;
#include "qgemm.inl"
}  // namespace dspark::ops::neoni8mm

#pragma GCC pop_options
