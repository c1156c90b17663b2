// dspark/model/aten_forward.hpp — a target's forward pass written in ATen
// ops, on any device ATen has (CPU, CUDA): what drafter training uses to
// compute target features on a GPU (`dspark train --device cuda`).
//
// It computes, for one whole sequence from position 0, what
// TargetModel::forward computes from an empty cache, layer by layer from the
// target's LayerRecipes (target.hpp): embedding × embed_scale, the family's
// blocks (RMSNorms, RoPE in either layout, grouped-query attention, causal or
// sliding-window, SwiGLU or GeGLU, post norms), the final norm, the LM head
// and its softcap. The weights are the target's own, dequantized once onto
// the device (ops::Linear::dequantized). It is not the decode path: no KV
// cache, no batch invariance, and agreement with the CPU kernels is to
// rounding (bf16 weights: ~1e-2 relative; fp32 weights: the kernels' bf16
// or int8 activations are the larger error), not bitwise.
#pragma once

#include <ATen/ATen.h>

#include <span>
#include <vector>

#include "dspark/model/target.hpp"

namespace dspark {

struct AtenForwardOptions {
  at::Device device = at::kCPU;
  /// dtype of the matrices on the device, and of the matmuls' inputs: bf16
  /// (what the target's bf16 compute path multiplies; on CUDA, fp32
  /// accumulation) or fp32. Norms, RoPE, softmax and the residual stream are
  /// fp32 either way.
  at::ScalarType weight_dtype = at::kBFloat16;
};

class AtenForward {
 public:
  /// Copies the target's weights onto opts.device (a 135M model: ~270 MB in
  /// bf16). `target` must outlive nothing here: the copy is complete.
  /// Throws dspark::InvalidArgument for a weight dtype other than bf16/fp32.
  AtenForward(const TargetModel& target, AtenForwardOptions opts = {});

  /// Runs tokens [T] (T >= 1) at positions 0..T-1. Returns tensors on the
  /// device: taps [T, m·d] fp32 (the output residual streams of
  /// taps.layers, concatenated in that order), final_hidden [T, d] fp32
  /// when taps.final_hidden, logits [T, V] (Logits::All) or [1, V] (Last)
  /// fp32. Throws InvalidArgument for an empty sequence, a token id outside
  /// [0, vocab), a tap layer outside [0, n_layers), or more tokens than the
  /// target's context.
  ForwardOut forward(std::span<const TokenId> tokens, Logits logits, const TapRequest& taps = {}) const;

  /// softcap(hidden [N, d] · lm_headᵀ) [N, V] fp32 on the device.
  at::Tensor head_logits(const at::Tensor& hidden) const;

  const TargetInfo& info() const { return info_; }
  at::Device device() const { return opts_.device; }

 private:
  // A LayerRecipe with its tensors on the device.
  struct Layer {
    at::Tensor attn_norm, q_norm, k_norm, post_attn_norm, ffn_norm, post_ffn_norm;  // fp32
    at::Tensor wqkv, wo, wgu, wdown;                                                // weight_dtype
    at::Tensor inv_freq;                                                            // [rot_dim/2] fp32
    bool gelu = false, rope_halves = false;
    int64_t rot_dim = 0, window = 0;
    float attn_scale = 0;
  };
  at::Tensor linear(const at::Tensor& x, const at::Tensor& w) const;
  at::Tensor rmsnorm(const at::Tensor& x, const at::Tensor& w) const;
  at::Tensor rope(const at::Tensor& x, const Layer& L, const at::Tensor& pos) const;
  void block(const Layer& L, at::Tensor& x, const at::Tensor& pos) const;

  TargetInfo info_;
  AtenForwardOptions opts_;
  at::Tensor embd_;      // [V, d] fp32, × embed_scale
  at::Tensor head_;      // [V, d] weight_dtype
  at::Tensor out_norm_;  // [d] fp32
  std::vector<Layer> layers_;
};

}  // namespace dspark
