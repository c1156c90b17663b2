// AVX2 level: quantized tiles on packed weights with vpmaddubsw (qgemm.inl).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "../../../level_kernels.hpp"
#include "../../../qformat.hpp"
#include "../../../qpack.hpp"

#pragma GCC push_options
#pragma GCC target("avx2,f16c")

namespace dspark::ops::avx2 {
constexpr bool kVnni = false;
#include "qgemm.inl"
}  // namespace dspark::ops::avx2

#pragma GCC pop_options
