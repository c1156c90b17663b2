// dspark/io/dequant.hpp — dequantization of ggml tensor blocks.
//
// Bit layouts follow ggml (ggml-quants.c / ggml-common.h): Q4_0, Q4_1, Q5_0,
// Q8_0 (32-element blocks with an f16 scale [and min]), Q4_K and Q6_K (256-element
// super-blocks with 6-bit / 8-bit sub-block scales), plus the plain F32, F16
// and BF16 types.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "dspark/io/gguf.hpp"

namespace dspark::io {

/// Decodes `n_elements` values of ggml type `type_id` stored at `src` into
/// `dst` (fp32). `n_elements` must be a multiple of the type's block size.
/// Supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K.
/// Throws dspark::FormatError naming the type for any other type id or a
/// count that is not a whole number of blocks.
void dequantize_to_f32(uint32_t type_id, const uint8_t* src, float* dst, int64_t n_elements);

/// Dequantizes a whole GGUF tensor into a new contiguous CPU tensor of
/// `dtype` (kBFloat16 or kFloat) with the row-major shape `info.shape()`.
/// Throws dspark::FormatError (message names the tensor and its type) for an
/// unsupported type.
at::Tensor dequantize_tensor(const GGUFTensorInfo& info, at::ScalarType dtype = at::kBFloat16);

/// IEEE binary16 bits -> fp32 (exact for every input).
float half_to_float(uint16_t h);

/// True when dequantize_to_f32 supports `type_id`.
bool dequant_supported(uint32_t type_id);

}  // namespace dspark::io
