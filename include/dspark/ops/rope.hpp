// dspark/ops/rope.hpp — rotary position embedding (RoFormer, Su et al. 2021):
// the frequency table, and the "NeoX" layout that rotates the two halves of a
// head (GGUF Gemma, Qwen, GPT-NeoX weights). The adjacent-pair layout of GGUF
// Llama weights is ops::rope_pairs (kernels.hpp); both take the same table.
#pragma once

#include <cstdint>
#include <vector>

namespace dspark::ops {

/// inv_freq[i] = base^(-2i / rot_dim) / linear_scale / factors[i] for
/// i < rot_dim / 2, computed in double and rounded to fp32 (llama.cpp's
/// rope_freq_base, rope_freq_scale = 1 / linear_scale, and Llama 3's per-dim
/// rope_freqs). `factors` may be null (all 1).
std::vector<float> rope_inv_freq(double base, int64_t rot_dim, double linear_scale = 1.0,
                                 const float* factors = nullptr);

/// NeoX layout: dims i and i + rot_dim/2 of each head rotate by the angle
/// pos * inv_freq[i], i < rot_dim/2; dims past rot_dim stay. x: [T, n_heads,
/// head_dim] fp32 in place (row stride `row_stride` floats between tokens),
/// positions: [T], inv_freq: [rot_dim / 2]. Computed by rope_pairs on the
/// interleaved halves, so both layouts share one arithmetic.
void rope_halves(float* x, int64_t T, int64_t row_stride, int64_t n_heads, int64_t head_dim,
                 int64_t rot_dim, const int64_t* positions, const float* inv_freq);

}  // namespace dspark::ops
