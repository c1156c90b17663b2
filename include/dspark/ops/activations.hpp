// dspark/ops/activations.hpp — elementwise kernels that some target families
// need beyond kernels.hpp: the GELU-gated MLP (GeGLU) and logit soft-capping.
//
// Elementwise, so every result is independent of the batch size and of the
// thread split (the batch invariance kernels.hpp describes).
#pragma once

#include <cstdint>

namespace dspark::ops {

/// GELU with the tanh approximation (Hendrycks & Gimpel 2016; PyTorch
/// `gelu(x, approximate="tanh")`, Gemma's `gelu_pytorch_tanh`), in fp32:
/// 0.5 x (1 + tanh z) with z = √(2/π) (x + 0.044715 x³), computed as the
/// equal x / (1 + exp(-2z)) with the kernels' exp (src/ops/kernel_table.hpp).
float gelu_tanh(float x);

/// GeGLU gating (Shazeer 2020): out[n, f] = gelu_tanh(gu[n, f]) * gu[n, F + f].
/// gu: [N, 2F] fp32 (gate rows, then up), out: [N, F] fp32. Parallel over
/// elements (ATen threads).
void gelu_tanh_mul(const float* gu, int64_t N, int64_t F, float* out);

/// Logit soft-capping (Gemma 2): x ← cap · tanh(x / cap) over n fp32 values in
/// place, tanh y = sign(y) (1 - 2 / (exp(2|y|) + 1)). cap <= 0 leaves x unchanged.
void softcap(float* x, int64_t n, float cap);

/// x ← x · s over n fp32 values in place.
void scale(float* x, int64_t n, float s);

}  // namespace dspark::ops
