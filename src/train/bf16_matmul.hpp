// src/train/bf16_matmul.hpp — matrix products in bf16 for the trainer: bf16
// operands, fp32 sums, a bf16 result, as a GPU's bf16 matmul computes them.
//
// On a GPU these are ATen's bf16 products. On a CPU ATen runs bf16 products
// through oneDNN (about twice fp32's rate, fp32 sums) only where the CPU has
// AVX-512 BW/VL/DQ and the product has more than 16³ multiply-adds; smaller
// ones, and every one on other CPUs, go to a scalar loop that sums in bf16.
// There the same result comes from an fp32 product of the bf16-rounded
// operands, rounded to bf16.
#pragma once

#include <ATen/ATen.h>

namespace dspark::train::detail {

/// Whether at::matmul(a, b) of bf16 tensors on their device computes the
/// product as above at bf16 speed (a, b: 2-D or batched, same device).
bool native_bf16_matmul(const at::Tensor& a, const at::Tensor& b);

/// a·b (at::matmul's broadcasting) with a and b rounded to bf16, fp32 sums,
/// the result rounded to bf16; dtype bf16. Differentiable.
at::Tensor matmul_bf16(const at::Tensor& a, const at::Tensor& b);

/// beta·c + alpha·a·b for 2-D a [M, K], b [K, N], c [M, N], every operand
/// rounded to bf16, fp32 sums, the result rounded to bf16; dtype bf16.
at::Tensor addmm_bf16(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, double beta, double alpha);

}  // namespace dspark::train::detail
