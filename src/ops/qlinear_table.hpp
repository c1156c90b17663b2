// qlinear_table.hpp — qlinear on one given kernel table (internal: the tests
// run every table this CPU has, including a level's variants).
#pragma once

#include <cstdint>

#include "dspark/ops/qmatmul.hpp"
#include "kernel_table.hpp"

namespace dspark::ops::detail {

void qlinear_table(const QActivations& x, const QLinear& layer, float* y, int64_t ldy, const KernelTable& kt);

}  // namespace dspark::ops::detail
