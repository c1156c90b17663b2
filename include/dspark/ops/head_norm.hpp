// dspark/ops/head_norm.hpp — RMSNorm of every attention head of a row (the
// per-head q/k norms of Gemma 3, Qwen3 and the DSpark drafter).
#pragma once

#include <cstdint>

namespace dspark::ops {

/// x: [T, n_heads, hd] fp32 with `row_stride` floats between tokens, in
/// place: each head's hd values become x / sqrt(mean(x²) + eps) * w, with w:
/// [hd] fp32 shared by the heads (ops::rmsnorm_f32 per head, same bits).
void head_rmsnorm(float* x, int64_t T, int64_t row_stride, int64_t n_heads, int64_t hd, const float* w,
                  float eps);

}  // namespace dspark::ops
