// kernel_table.hpp — the per-level kernel table (internal to src/ops).
//
// One KernelTable per kernel level (include/dspark/ops/kernel_level.hpp). The
// drivers in src/ops/*.cpp (threading, tiling, ring buffers, argument checks)
// call these entries; each level implements them in its own files:
//   src/ops/portable/        the reference, plain C++ (any compiler, any CPU)
//   src/ops/arch/x86/avx2/   AVX2 + F16C (+ AVX-VNNI)
//   src/ops/arch/x86/avx512/ AVX-512 VNNI
//   src/ops/arch/arm/neon/   aarch64 NEON + dotprod
// Every entry returns the same bits on every level for finite inputs: the
// contracts below fix each output's sequence of fp32 operations.
//
// Float contract. Multiplies and adds are never fused (the project compiles
// with -ffp-contract=off). A "16-lane sum" of terms t_k, k = 0..n-1, is: lane
// l = 0..15 adds t_l, t_{l+16}, ... in order starting from +0; then lanes l and
// l+8 are added, then l and l+4, l and l+2, l and l+1 (tree16). exp is
// vexp() of src/ops/generic/vec_math.inl (a clamp, a Cody-Waite reduction
// and one polynomial, all multiplies and adds).
#pragma once

#include <cstdint>
#include <vector>

#include "dspark/ops/kernel_level.hpp"

namespace dspark::ops::detail {

// ---- quantized products -------------------------------------------------------------
// See include/dspark/ops/qmatmul.hpp for the arithmetic and src/ops/qpack.hpp for the
// packed tile layout.

/// One activation pair (64 values): codes in the layout's byte order and, per
/// fold unit, the unit's scale dx, code sum s and dx·s (112 bytes).
struct XPair {
  int8_t q[64];
  float dx[4];
  int32_t s[4];
  float sdx[4];
};

/// Weight types of the quantized kernels, in table order.
enum QType : int { kQ8_0, kQ4_0, kQ4_1, kQ5_0, kQ4_K, kQ6_K, kQTypes };

/// One tile of up to 16 consecutive weight rows.
struct QTile {
  const uint8_t* raw;      // first row, GGUF block layout (row_bytes apart)
  int64_t row_bytes;
  const uint8_t* packed;   // the same rows in the packed tile layout (qpack.hpp), or null
  int rows;                // 1..16
};

/// y[n * ldy + r] = row r of the tile · activation row n, for r < tile.rows,
/// n < N. x[n] points to row n's pairs; n_blocks32 = cols / 32. `scratch`:
/// 64-byte aligned, at least 32 * N floats.
using QTileFn = void (*)(const QTile& tile, const XPair* const* x, int64_t N, int64_t n_blocks32, float* y,
                         int64_t ldy, float* scratch);

// ---- the table --------------------------------------------------------------------------

struct KernelTable {
  KernelLevel level;
  /// The quantized kernels read QTile::packed (else QTile::raw).
  bool packed_weights;
  QTileFn qtile[kQTypes];

  /// Activation codes per 32 values as ggml's Q8_0 / Q8_1: for each block b <
  /// nb, amax = max|v|, id = amax != 0 ? 127 / amax : 0, code = round-to-even
  /// (v · id), d[b] = amax / 127.
  void (*quantize32)(const float* v, int64_t nb, int8_t* codes, float* d);

  /// bf16 products: y[n * ldy + r] = 16-lane sum over k of W[r, k] · x[n, k]
  /// (bf16 values widened exactly), r < rows (<= 16), n < N; K % 32 == 0.
  /// `next` (or null): the next block's first weight row, to prefetch.
  void (*bf16_block)(const uint16_t* x, int64_t N, const uint16_t* W, int rows, int64_t K, float* y, int64_t ldy,
                     const uint16_t* next);

  /// 16-lane sum of a[k] · b[k], k < n.
  float (*dot)(const float* a, const float* b, int64_t n);
  /// Attention scores of nq queries against one KV group's keys (each key row
  /// read once for all of them): s[i][j] = dot(q[i], K + j * hd, hd) · scale
  /// for j < L[i].
  void (*scores)(const float* const* q, const int64_t* L, int nq, const float* K, int64_t hd, float scale,
                 float* const* s);
  /// p[j] = exp(p[j] - max_j p[j]) for j < L (L >= 1); returns their 16-lane sum.
  float (*softmax_num)(float* p, int64_t L);
  /// acc[i][d] = acc[i][d] + p[i][j] · V[j * hd + d] for j = j0..j1-1 in order,
  /// d < hd, i < nq (each value row read once for all queries).
  void (*pv)(const float* const* p, int nq, const float* V, int64_t j0, int64_t j1, int64_t hd, float* const* acc);
  /// One row: ss = dot(x, x, D), inv = 1 / sqrt(ss / D + eps), out[d] = (x[d] · inv) · w[d].
  void (*rmsnorm)(const float* x, const float* w, int64_t D, float eps, float* out);
  /// One head of rot pairs: (a, b) = (v[2i], v[2i+1]) ->
  /// (a·c - b·s, a·s + b·c) with (c, s) = (cs[2i], cs[2i+1]), i < half.
  void (*rope)(float* v, const float* cs, int64_t half);
  /// out[i] = (g[i] / (1 + exp(-g[i]))) · u[i].
  void (*silu_mul)(const float* g, const float* u, int64_t n, float* out);
  /// out[i] = (x / (1 + exp(-2 · c · (x + 0.044715 · x³)))) · u[i], x = g[i],
  /// c = sqrt(2/π) (the tanh form of GELU: 0.5·(1 + tanh z) = 1 / (1 + e^{-2z})).
  void (*gelu_tanh_mul)(const float* g, const float* u, int64_t n, float* out);
  /// x[i] = cap · tanh(x[i] · (1 / cap)), tanh y = sign(y) · (1 - 2 / (exp(2|y|) + 1)).
  void (*softcap)(float* x, int64_t n, float cap);
};

/// Every table this CPU runs, portable first; a level may have several
/// (AVX2 with and without AVX-VNNI), its fullest last.
std::vector<const KernelTable*> runnable_tables();
/// runnable_tables() and the variants this CPU can check but never runs
/// (x86 with AVX-512 VNNI and without AVX-VNNI: the AVX-VNNI tiles built with
/// the EVEX vpdpbusd), for the tests that compare every table with portable.
std::vector<const KernelTable*> checked_tables();
/// The fullest table of `level`. Throws InvalidArgument when this build or this CPU
/// cannot run it.
const KernelTable& kernel_table(KernelLevel level);
/// The table of active_kernel_level().
const KernelTable& active_kernels();

// Per-level tables, defined beside their kernels.
extern const KernelTable kPortableKernels;
#if defined(__x86_64__)
extern const KernelTable kAvx2Kernels;
extern const KernelTable kAvx2VnniKernels;
extern const KernelTable kAvx2VnniEvexKernels;
extern const KernelTable kAvx512Kernels;
#endif
#if defined(__aarch64__)
extern const KernelTable kNeonKernels;
extern const KernelTable kNeonI8mmKernels;
#endif

}  // namespace dspark::ops::detail
