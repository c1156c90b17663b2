// dspark/ops/kernels.hpp — CPU kernels of the target forward pass.
//
// These are the decode hot path. Every kernel computes each output row
// independently with a fixed reduction order, so a row's result is bitwise
// identical whether it is computed alone or inside a batch of any size
// ("batch invariance"). Speculative verification relies on this: the logits
// of position t must not depend on how many tokens the same forward call
// verifies, or greedy speculative output could drift from plain decoding.
//
// bf16 values are passed as uint16_t bit patterns (the upper half of an
// IEEE fp32). On CPUs with AVX512-BF16 the dot products use vdpbf16ps; other
// CPUs take a portable path (same results for a given machine).
#pragma once

#include <cstdint>

namespace dspark::ops {

/// fp32 -> bf16 with round-to-nearest-even (NaN stays NaN).
uint16_t f32_to_bf16(float v);
/// bf16 -> fp32 (exact).
float bf16_to_f32(uint16_t v);

/// y[n, o] = sum_k x[n, k] * W[o, k] for n < N, o < O.
/// x: [N, K] bf16 (row stride K), W: [O, K] bf16 (row stride K),
/// y: [N, O] fp32 with row stride `ldy` (>= O). Parallel over O.
/// K must be a multiple of 32 (throws dspark::InvalidArgument otherwise).
/// Each result is bitwise independent of N, of the other rows and of the
/// thread count. Decode is bound by weight memory traffic, so the kernel
/// prefetches the next 16-row weight block while computing the current one;
/// with several rows this overlaps memory and arithmetic (SmolLM2's matmuls,
/// 1 thread: 8 rows 18.0 -> 13.5 ms, 1 row 10.5 -> 8.2 ms).
void linear_bf16(const uint16_t* x, int64_t N, const uint16_t* W, int64_t O, int64_t K,
                 float* y, int64_t ldy);

/// RMSNorm (Zhang & Sennrich 2019) of each row: out = x / sqrt(mean(x^2) + eps) * w.
/// x: [N, D] fp32, w: [D] fp32, out: [N, D] bf16.
void rmsnorm_to_bf16(const float* x, const float* w, int64_t N, int64_t D, float eps,
                     uint16_t* out);
/// Same, fp32 output (for hidden taps that must keep precision).
void rmsnorm_f32(const float* x, const float* w, int64_t N, int64_t D, float eps, float* out);

/// Rotary position embedding (RoFormer, Su et al. 2021), "normal" pair layout
/// used by GGUF llama-family weights: dims (2i, 2i+1) rotate by
/// angle pos * inv_freq[i]. x: [T, n_heads, head_dim] fp32 in place (row stride
/// `row_stride` floats between tokens), positions: [T], inv_freq: [rot_dim/2].
/// Only the first rot_dim dims of each head rotate.
void rope_pairs(float* x, int64_t T, int64_t row_stride, int64_t n_heads, int64_t head_dim,
                int64_t rot_dim, const int64_t* positions, const float* inv_freq);

/// Grouped-query attention of T new queries against a KV cache.
/// q: [T, n_heads, hd] fp32 (row stride q_stride); K, V: [n_kv, cap, hd] fp32
/// (the new keys/values already written at rows n_past..n_past+T-1).
/// causal: query t sees keys 0..n_past+t; otherwise every query sees keys
/// 0..n_past+T-1 (bidirectional inside the block, as the drafter needs).
/// out: [T, n_heads*hd] fp32. Each (t, head) pair is computed independently
/// (batch invariant); with AVX-512 and hd % 16 == 0, scores go 16 keys per
/// reduction and P·V keeps its accumulators in registers, in the scalar
/// path's order per element (P·V by fused multiply-adds). With hd % 64 == 0, up to six
/// queries of one KV group share each pass over its keys and values (same
/// operations per element, so the same bits).
/// Parallel over (group, t, head); the split never changes a result.
void attention(const float* q, int64_t q_stride, const float* K, const float* V, int64_t cap,
               int64_t n_past, int64_t T, int64_t n_heads, int64_t n_kv, int64_t hd, float scale,
               float* out, bool causal = true);

/// SwiGLU: out[n, f] = silu(gu[n, f]) * gu[n, F + f]; gu: [N, 2F] fp32, out: [N, F] fp32.
/// Parallel over elements (ATen threads); results do not depend on the split.
void silu_mul(const float* gu, int64_t N, int64_t F, float* out);

/// x[n, :] += y[n, :] over [N, D] fp32 (y with row stride ldy).
void add_rows(float* x, const float* y, int64_t N, int64_t D, int64_t ldy);

}  // namespace dspark::ops
