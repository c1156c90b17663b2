// The AVX-VNNI variant of the AVX2 tiles (qgemm.inl with kVnni = true), built
// with AVX-512 VNNI's EVEX encoding of the 256-bit vpdpbusd (the same
// operation: u8 x s8 products, four a lane, summed into int32). Never chosen
// to run: it exists so that CPUs with AVX-512 VNNI but without AVX-VNNI (the
// AVX-512 machines this project is developed on) check the VNNI variant's
// code bit for bit against the portable kernel (detail::checked_tables()).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "../../../level_kernels.hpp"
#include "../../../qformat.hpp"
#include "../../../qpack.hpp"

#pragma GCC push_options
#pragma GCC target("avx2,f16c,avx512f,avx512vl,avx512vnni")

namespace dspark::ops::avx2vnni_evex {
constexpr bool kVnni = true;
#define DSPARK_DPBUSD256 _mm256_dpbusd_epi32
#include "qgemm.inl"
#undef DSPARK_DPBUSD256
}  // namespace dspark::ops::avx2vnni_evex

#pragma GCC pop_options
