// dspark/ops/qmatmul.hpp — matrix products on ggml-quantized weights.
//
// The weights stay in their GGUF blocks (read straight from the mapped file);
// the activations are quantized per row to int8 blocks of 32 with an fp32
// scale, and each output is a sum over blocks of integer dot products
// (AVX512-VNNI `vpdpbusd`, unsigned weight codes x signed activation codes)
// scaled in fp32 (vpdpbusd / vpmaddubsw / sdot per kernel level, see
// kernel_level.hpp). Supported weight types (ggml-common.h layouts, see
// io/dequant.cpp): Q8_0, Q4_0, Q4_1, Q5_0 (32-element blocks) and Q4_K, Q6_K
// (256-element super-blocks).
//
// Every weight type is written as  w = dw_b * q + mw_b  per block (or
// sub-block) b with an unsigned code q:
//   Q8_0 q = code + 128, mw = -128 dw     Q4_0 q in [0, 15], mw = -8 dw
//   Q5_0 q in [0, 31], mw = -16 dw        Q4_1 mw = m (the block's min)
//   Q6_K q in [0, 63], dw = d sc, mw = -32 dw (16-element sub-blocks)
//   Q4_K dw = d sc, mw = -dmin m (32-element sub-blocks)
// so  y = Σ_b dx_b (dw_b Σ q·x_q + mw_b Σ x_q)  with x = dx_b x_q. The
// activations are quantized exactly as ggml quantizes them for each weight
// type (see QActivations), so the integer sums are llama.cpp's.
//
// Batch invariance. A dot product is one fixed sequence of fp32 operations
// over its fold units u (the blocks, or Q6_K's 16-element sub-blocks), in
// order:  I_u = Σ q·x_q - (offset) Σ x_q  exactly in int32, then
//   acc  = acc + float(I_u) · (dw_u · dx_u)
//   accm = accm + mw_u · (dx_u · Σx_q)        (Q4_1, Q4_K)
//   y    = acc + accm
// (each operation rounded on its own: no fused multiply-add). The SIMD
// kernels compute it for 8 or 16 weight rows at once (one row per lane) and
// the portable path one row at a time, with the same operations, so each
// result is bitwise the same for every batch size, row position, thread split
// and kernel level. Weights are read from 16-row tiles packed at load time
// by levels that want them (src/ops/qpack.hpp), from the GGUF blocks
// otherwise.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "dspark/io/gguf.hpp"
#include "dspark/ops/kernel_level.hpp"

namespace dspark::ops {

namespace detail {
struct PackedQ;
}  // namespace detail

/// True when qlinear computes on weights of this ggml type.
bool quant_supported(io::GGMLType type);

/// One weight matrix in a ggml block format: `rows` rows of `cols` values,
/// row-major, each row `row_bytes()` bytes of whole blocks. `data` usually
/// points into a mapped GGUF file; `owner` keeps copied data alive. `packed`:
/// the same weights in 16-row tiles for the active kernel level, when it
/// reads them (set by qmatrix_from_gguf, gather_rows and pack()).
struct QMatrix {
  io::GGMLType type = io::GGMLType::Q8_0;
  int64_t rows = 0;
  int64_t cols = 0;
  const uint8_t* data = nullptr;
  std::shared_ptr<const void> owner;
  std::shared_ptr<const detail::PackedQ> packed;

  int64_t row_bytes() const;
  const uint8_t* row(int64_t r) const { return data + r * row_bytes(); }
  /// A copy holding only the listed rows, in that order (for a draft
  /// vocabulary's LM-head rows). Throws InvalidArgument on a bad id.
  QMatrix gather_rows(const std::vector<int64_t>& ids) const;
  /// Sets `packed` when the active kernel level reads packed tiles.
  void pack_for_active_level();
  /// Row r dequantized into out[cols] (fp32).
  void dequantize_row(int64_t r, float* out) const;
};

/// Builds a QMatrix over a GGUF tensor of shape [rows, cols] (no copy).
/// Throws FormatError naming the tensor when its type is not supported or its
/// row length is not a whole number of blocks.
QMatrix qmatrix_from_gguf(const io::GGUFTensorInfo& t);

/// A linear layer whose output rows are the concatenation of several weight
/// matrices with the same column count (e.g. q, k and v; gate and up), each
/// kept in its own storage and type. Output row o of part i comes after all
/// rows of parts 0..i-1.
struct QLinear {
  std::vector<QMatrix> parts;
  int64_t rows() const;
  int64_t cols() const { return parts.empty() ? 0 : parts.front().cols; }
};

/// Activations quantized for the weight types of one QLinear: rows of `cols`
/// values in 64-element pairs of int8 codes, each pair with its fold units'
/// scales and code sums (112 bytes per 64 values), in the byte order the
/// weight type's kernel reads (see qmatmul.cpp).
class QActivations {
 public:
  /// Quantizes x [N, K] fp32 (row stride K) for `layer`'s weight types, the
  /// way ggml quantizes activations for them: for Q8_0, Q4_0, Q4_1 and Q5_0
  /// weights per block of 32 (Q8_0 / Q8_1 rows: x_q = round(x·127/max|x|),
  /// dx = max|x|/127 and dx·Σx_q as binary16); for Q4_K and Q6_K per block
  /// of 256 (Q8_K rows: the value of largest magnitude maps to -127, dx fp32).
  /// Throws InvalidArgument when K is not a whole number of blocks. The codes
  /// are the same on every kernel level (`level`: the active one by default).
  QActivations(const float* x, int64_t N, int64_t K, const QLinear& layer);
  QActivations(const float* x, int64_t N, int64_t K, const QLinear& layer, KernelLevel level);
  int64_t n() const { return n_; }
  int64_t k() const { return k_; }
  /// Pairs of row `n` in layout `layout` (see qmatmul.cpp).
  const uint8_t* pairs(int layout, int64_t n) const;

 private:
  int64_t n_, k_, n_pairs_;
  std::vector<uint8_t> buf_[4];  // per format: [N, n_pairs, 112 bytes]
};

/// y[n, o] = Σ_k dequant(W)[o, k] · dequant(quant(x))[n, k] for n < N,
/// o < layer.rows(); y [N, O] fp32 with row stride ldy (>= O). `cols` must
/// be a multiple of 32 (of 256 for the K-quants). Parallel over output rows
/// (ATen threads). Results are bitwise the same for every N, row position,
/// thread count and kernel level (see the file comment): the active level,
/// or `level` (a level whose kernels read packed tiles packs matrices that
/// lack them for this call). Throws InvalidArgument on a dimension mismatch
/// or a level this CPU cannot run.
void qlinear(const QActivations& x, const QLinear& layer, float* y, int64_t ldy);
void qlinear(const QActivations& x, const QLinear& layer, float* y, int64_t ldy, KernelLevel level);

/// Convenience: quantizes x [N, K] fp32 and multiplies.
void qlinear(const float* x, int64_t N, const QLinear& layer, float* y, int64_t ldy);
void qlinear(const float* x, int64_t N, const QLinear& layer, float* y, int64_t ldy, KernelLevel level);

}  // namespace dspark::ops
