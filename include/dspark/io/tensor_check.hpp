// dspark/io/tensor_check.hpp — refuse a GGUF tensor whose stored numbers are
// not finite: the values of F32 / F16 / BF16 tensors, the f16 block scales
// (and minimums) of quantized ones. A NaN scale does not always reach the
// logits as NaN (the int8 quantization of activations turns NaN into a
// finite code), so a corrupt file would otherwise decode wrong text quietly.
// Block layouts: ggml's block_q4_0 ... block_q6_K (ggml-common.h).
#pragma once

#include "dspark/io/gguf.hpp"

namespace dspark::io {

/// Throws FormatError "<path>: tensor '<name>' ..." naming the first
/// non-finite value or scale (its element or block index). Types without
/// floating-point fields (I8 ... I64) and unknown types pass.
void check_tensor_finite(const GGUFTensorInfo& t, const std::string& path);

}  // namespace dspark::io
