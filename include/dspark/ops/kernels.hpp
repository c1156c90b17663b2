// dspark/ops/kernels.hpp — CPU kernels of the target forward pass.
//
// These are the decode hot path. Every kernel computes each output row
// independently with a fixed reduction order, so a row's result is bitwise
// identical whether it is computed alone or inside a batch of any size
// ("batch invariance"). Speculative verification relies on this: the logits
// of position t must not depend on how many tokens the same forward call
// verifies, or greedy speculative output could drift from plain decoding.
//
// The arithmetic runs on the process's kernel level (kernel_level.hpp), with
// the same bits on every level: each output is one fixed sequence of fp32
// operations (src/ops/kernel_table.hpp states it per kernel).
//
// bf16 values are passed as uint16_t bit patterns (the upper half of an
// IEEE fp32).
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
/// Each result is a 16-lane sum (lane l over k = l, l+16, ...; products of
/// bf16 values are exact in fp32), bitwise independent of N, of the other
/// rows, of the thread count and of the kernel level. The kernel prefetches
/// the next 16-row weight block while computing the current one.
void linear_bf16(const uint16_t* x, int64_t N, const uint16_t* W, int64_t O, int64_t K,
                 float* y, int64_t ldy);

/// RMSNorm (Zhang & Sennrich 2019) of each row: out = x / sqrt(mean(x^2) + eps) * w,
/// as (x · inv) · w with inv = 1 / sqrt(Σx²/D + eps), Σx² a 16-lane sum.
/// x: [N, D] fp32, w: [D] fp32, out: [N, D] fp32 (may alias x).
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
/// (batch invariant): scores s_j = (q·k_j as a 16-lane sum) · scale, p_j =
/// exp(s_j - max s) with their 16-lane sum S, o = (Σ_j p_j v_j, j in order) · (1/S).
/// Parallel over (t, head); the split never changes a result.
void attention(const float* q, int64_t q_stride, const float* K, const float* V, int64_t cap,
               int64_t n_past, int64_t T, int64_t n_heads, int64_t n_kv, int64_t hd, float scale,
               float* out, bool causal = true);

/// SwiGLU: out[n, f] = silu(gu[n, f]) * gu[n, F + f]; gu: [N, 2F] fp32, out: [N, F] fp32;
/// silu(g) = g / (1 + exp(-g)) with the kernels' exp.
/// Parallel over elements (ATen threads); results do not depend on the split.
void silu_mul(const float* gu, int64_t N, int64_t F, float* out);

/// x[n, :] += y[n, :] over [N, D] fp32 (y with row stride ldy).
void add_rows(float* x, const float* y, int64_t N, int64_t D, int64_t ldy);

/// acc[d] = acc[d] + p[j] · rows[j, d] for j = 0..n-1 in that order, d < D
/// (the attention kernels' p·V on one query): a product with a short inner
/// dimension (a rank-n factor [n, D] fp32, e.g. the drafter's Markov head)
/// as n passes over D lanes, without a dot product per output. One thread;
/// the same bits on every kernel level.
void weighted_rows(const float* p, const float* rows, int64_t n, int64_t D, float* acc);

}  // namespace dspark::ops
