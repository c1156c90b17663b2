// dspark/ops/linear.hpp — a linear layer over GGUF weights, computed either
// on the quantized blocks (ops/qmatmul.hpp) or on a bf16 copy
// (ops::linear_bf16), chosen once at load time.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dspark/io/gguf.hpp"
#include "dspark/ops/qmatmul.hpp"

namespace dspark::ops {

/// How a target's weight matrices are multiplied.
///   Quant: on the GGUF's quantized blocks with int8 activations (tensors of
///          types the quantized kernels lack, e.g. F16, go through bf16);
///   BF16:  every matrix dequantized to bf16 at load, bf16 activations.
enum class Compute { Quant, BF16 };
std::string to_string(Compute c);

/// y = x · Wᵀ for W the row-wise concatenation of one or more weight tensors
/// with the same column count (e.g. attn_q, attn_k, attn_v).
class Linear {
 public:
  Linear() = default;

  /// Loads `names` from `f` as one [Σ rows, cols] matrix. `rows` gives the
  /// expected row count of each tensor. Throws FormatError naming the
  /// tensor when one is missing, has another shape or an unsupported type.
  static Linear load(const io::GGUFFile& f, const std::vector<std::string>& names,
                     const std::vector<int64_t>& rows, int64_t cols, Compute compute);
  /// A bf16 layer over an existing [rows, cols] tensor (any float dtype).
  static Linear from_tensor(const at::Tensor& w);
  /// A Q8_0 layer over an existing [rows, cols] tensor (cols % 32 == 0),
  /// quantized as ggml does (per block of 32: d = max|w| / 127 stored as
  /// fp16, codes round(w / d)), for the quantized kernels. Throws
  /// InvalidArgument when cols is not a multiple of 32.
  static Linear from_tensor_q8_0(const at::Tensor& w);

  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  /// True when every part is computed on quantized blocks.
  bool quantized() const;
  /// "Q4_1", "Q8_0+Q6_K", "bf16": what the kernels read.
  std::string type_name() const;
  /// Bytes of weights a product reads.
  int64_t weight_bytes() const;

  /// y [N, rows()] fp32 (row stride ldy >= rows()) = x [N, cols()] fp32 · Wᵀ.
  /// Each output row is bitwise independent of N and of the other rows.
  void forward(const float* x, int64_t N, float* y, int64_t ldy) const;

  /// Row r of W in fp32 (exact for bf16 parts; the block's values otherwise).
  void row_f32(int64_t r, float* out) const;
  /// A layer holding only the listed rows of W, in that order (for a draft
  /// vocabulary). Throws InvalidArgument on an id outside [0, rows()).
  Linear gather_rows(const std::vector<int64_t>& ids) const;
  /// W dequantized to a new [rows, cols] tensor of `dtype`.
  at::Tensor dequantized(at::ScalarType dtype = at::kBFloat16) const;

 private:
  struct Part {
    QMatrix q;          // quantized part (q.data != nullptr)
    at::Tensor bf16;    // or a bf16 [rows, cols] part
    int64_t rows = 0;
  };
  /// Consecutive quantized parts share one quantization of x and one kernel call.
  struct Run {
    QLinear q;          // quantized parts, or empty for a bf16 part
    size_t part = 0;    // the bf16 part otherwise
    int64_t row0 = 0;   // first output row
  };
  void make_runs();
  std::vector<Part> parts_;
  std::vector<Run> runs_;
  int64_t rows_ = 0, cols_ = 0;
};

}  // namespace dspark::ops
