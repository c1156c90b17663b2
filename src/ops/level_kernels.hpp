// level_kernels.hpp — the entry points each kernel level defines (internal);
// dispatch.cpp puts them into the levels' KernelTables. Contracts:
// kernel_table.hpp.
#pragma once

#include <cstdint>

#include "kernel_table.hpp"

// fp32 kernels, defined from generic/float_kernels.inl.
#define DSPARK_FLOAT_KERNELS                                                                     \
  float dot(const float* a, const float* b, int64_t n);                                          \
  void scores(const float* const* q, const int64_t* L, int nq, const float* K, int64_t hd, float scale,   \
              float* const* s);                                                                  \
  float softmax_num(float* p, int64_t L);                                                        \
  void pv(const float* const* p, int nq, const float* V, int64_t j0, int64_t j1, int64_t hd,       \
          float* const* acc);                                                                    \
  void rmsnorm(const float* x, const float* w, int64_t D, float eps, float* out);                \
  void rope(float* v, const float* cs, int64_t half);                                            \
  void silu_mul(const float* g, const float* u, int64_t n, float* out);                          \
  void gelu_tanh_mul(const float* g, const float* u, int64_t n, float* out);                     \
  void softcap(float* x, int64_t n, float cap);

// Quantized tiles, one per weight type (QTileFn).
#define DSPARK_QTILE_KERNELS                                                                     \
  void qtile_q8_0(const detail::QTile&, const detail::XPair* const*, int64_t, int64_t, float*, int64_t, float*); \
  void qtile_q4_0(const detail::QTile&, const detail::XPair* const*, int64_t, int64_t, float*, int64_t, float*); \
  void qtile_q4_1(const detail::QTile&, const detail::XPair* const*, int64_t, int64_t, float*, int64_t, float*); \
  void qtile_q5_0(const detail::QTile&, const detail::XPair* const*, int64_t, int64_t, float*, int64_t, float*); \
  void qtile_q4_k(const detail::QTile&, const detail::XPair* const*, int64_t, int64_t, float*, int64_t, float*); \
  void qtile_q6_k(const detail::QTile&, const detail::XPair* const*, int64_t, int64_t, float*, int64_t, float*);

// Defines a level's six QTileFn entry points from `tile`, a function template
// over detail::QType with QTileFn's parameters (in the level's namespace).
#define DSPARK_DEFINE_QTILES(tile)                                                                      \
  void qtile_q8_0(const detail::QTile& t, const detail::XPair* const* x, int64_t N, int64_t nb, float* y, \
                  int64_t ldy, float* s) {                                                              \
    tile<detail::kQ8_0>(t, x, N, nb, y, ldy, s);                                                        \
  }                                                                                                     \
  void qtile_q4_0(const detail::QTile& t, const detail::XPair* const* x, int64_t N, int64_t nb, float* y, \
                  int64_t ldy, float* s) {                                                              \
    tile<detail::kQ4_0>(t, x, N, nb, y, ldy, s);                                                        \
  }                                                                                                     \
  void qtile_q4_1(const detail::QTile& t, const detail::XPair* const* x, int64_t N, int64_t nb, float* y, \
                  int64_t ldy, float* s) {                                                              \
    tile<detail::kQ4_1>(t, x, N, nb, y, ldy, s);                                                        \
  }                                                                                                     \
  void qtile_q5_0(const detail::QTile& t, const detail::XPair* const* x, int64_t N, int64_t nb, float* y, \
                  int64_t ldy, float* s) {                                                              \
    tile<detail::kQ5_0>(t, x, N, nb, y, ldy, s);                                                        \
  }                                                                                                     \
  void qtile_q4_k(const detail::QTile& t, const detail::XPair* const* x, int64_t N, int64_t nb, float* y, \
                  int64_t ldy, float* s) {                                                              \
    tile<detail::kQ4_K>(t, x, N, nb, y, ldy, s);                                                        \
  }                                                                                                     \
  void qtile_q6_k(const detail::QTile& t, const detail::XPair* const* x, int64_t N, int64_t nb, float* y, \
                  int64_t ldy, float* s) {                                                              \
    tile<detail::kQ6_K>(t, x, N, nb, y, ldy, s);                                                        \
  }

// Activation quantization and bf16 products.
#define DSPARK_ROW_KERNELS                                                                       \
  void quantize32(const float* v, int64_t nb, int8_t* codes, float* d);                          \
  void bf16_block(const uint16_t* x, int64_t N, const uint16_t* W, int rows, int64_t K, float* y, \
                  int64_t ldy, const uint16_t* next);

namespace dspark::ops::portable {
DSPARK_FLOAT_KERNELS
DSPARK_QTILE_KERNELS
DSPARK_ROW_KERNELS
}  // namespace dspark::ops::portable

#if defined(__x86_64__)
namespace dspark::ops::avx2 {
DSPARK_FLOAT_KERNELS
DSPARK_QTILE_KERNELS
DSPARK_ROW_KERNELS
}  // namespace dspark::ops::avx2
namespace dspark::ops::avx2vnni {
DSPARK_QTILE_KERNELS
}  // namespace dspark::ops::avx2vnni
namespace dspark::ops::avx2vnni_evex {
DSPARK_QTILE_KERNELS
}  // namespace dspark::ops::avx2vnni_evex
namespace dspark::ops::avx512 {
DSPARK_FLOAT_KERNELS
DSPARK_QTILE_KERNELS
void bf16_block(const uint16_t* x, int64_t N, const uint16_t* W, int rows, int64_t K, float* y, int64_t ldy,
                const uint16_t* next);
}  // namespace dspark::ops::avx512
#endif

#if defined(__aarch64__)
namespace dspark::ops::neon {
DSPARK_FLOAT_KERNELS
DSPARK_QTILE_KERNELS
DSPARK_ROW_KERNELS
}  // namespace dspark::ops::neon
namespace dspark::ops::neoni8mm {
DSPARK_QTILE_KERNELS
}  // namespace dspark::ops::neoni8mm
#endif
