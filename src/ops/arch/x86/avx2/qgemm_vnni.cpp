// AVX2 level on CPUs with AVX-VNNI: quantized tiles on packed weights with
// the 256-bit vpdpbusd (qgemm.inl).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "../../../level_kernels.hpp"
#include "../../../qformat.hpp"
#include "../../../qpack.hpp"

#pragma GCC push_options
#pragma GCC target("avx2,f16c,avxvnni")

namespace dspark::ops::avx2vnni {
constexpr bool kVnni = true;
#include "qgemm.inl"
}  // namespace dspark::ops::avx2vnni

#pragma GCC pop_options
