// dspark/train/drafter_graph.hpp — the differentiable, batched forward pass of
// the DSpark drafter used for training (DSpark arXiv 2607.05147 Eq. 2-8;
// DFlash arXiv 2602.06036), built from ATen ops so that autograd records it.
//
// It computes exactly what Drafter::block_hidden + Drafter::draft compute at
// inference, for many anchors of one sequence at once, with the sequential
// head run under teacher forcing (the previous tokens are given instead of
// drawn). Notation: N anchors, γ slots per block, L context rows, d hidden,
// m tapped layers, V vocabulary, r Markov rank, H / Hkv attention / KV heads,
// hd head dim.
//
// For anchor i at absolute position p_i with previous tokens
// prev[i] = [x_{-1} = anchor, x_0, .., x_{γ-2}]:
//   H_ctx = hidden_norm(fc · feats)                                  [L, d]
//   x     = embed([anchor, MASK × (γ-1)])                            [N, γ, d]
//   per layer: h = attn_norm(x); q = rope(q_norm(W_q h)) at p_i..p_i+γ-1;
//     keys/values = [rope(k_norm(W_k H_ctx)) at 0..L-1 ; rope(k_norm(W_k h))],
//     [W_v H_ctx ; W_v h]; context key l is visible to anchor i iff l < p_i;
//     block keys are all visible (no causal mask); x += W_o attn;
//     x += W_down(silu(W_gate h') ⊙ W_up h'), h' = ffn_norm(x)
//   h = output_norm(x)                                               [N, γ, d]
//   U = LMHead(h) (the target's frozen head)                         [N, γ, V']
//   logits_k = U_k + B_k(prev, h)          (Eq. 5 / 6 and variants, see drafter_heads)
//   z_k = w · [h_k ; W1[x_{k-1}]] + b      (Eq. 7; c_k = σ(z_k))
// Output vocabulary: V' = V, or with a draft vocabulary D (DrafterConfig::
// draft_vocab) V' = |D|: as in Drafter::bind / draft, only the rows of D of
// the frozen head and of the sequential head's output matrix (markov_w2 /
// elman.wo, restricted by a differentiable row gather) are evaluated, and
// logit row i belongs to token D[i]. The previous-token embedding W1 and the
// anchor / MASK embeddings still index the full vocabulary.
// RoPE uses the GGUF "normal" pair layout (dims 2i, 2i+1), angles computed in
// double precision as the inference kernel does.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <string>

#include "dspark/speculative/drafter.hpp"

namespace dspark::train {

/// Drafter parameters by name (the names of Drafter::param_spec).
using ParamMap = std::map<std::string, at::Tensor>;

/// Precision of the large matrix products when the parameters are fp32.
/// BFloat16: inputs and weights are rounded to bf16 for the product, sums in
/// fp32, the result rounded to bf16 and converted back to fp32, as a GPU's
/// bf16 matmul (src/train/bf16_matmul.hpp: oneDNN where the CPU has AVX-512,
/// else fp32 products of the rounded operands, where the frozen LM head uses
/// the inference kernel instead, fp32 output); norms, softmax, RoPE and the
/// heads' element-wise math stay fp32. Float32: everything fp32 (slow on CPUs
/// whose libtorch uses a generic BLAS, but the reference for parity tests).
/// Double-precision parameters always compute in double (gradient checks).
enum class MatmulPrecision { Float32, BFloat16 };

struct GraphOptions {
  MatmulPrecision matmul = MatmulPrecision::BFloat16;
  /// On CPU tensors without oneDNN's bf16 products, run the frozen LM head
  /// on dspark's bf16 kernel (ops::linear_bf16). false: ATen ops only, as on
  /// any other device (the same products with ATen's rounding; for checking
  /// the device path on a CPU).
  bool kernels = true;
};

/// Outputs of DrafterGraph::forward, in the parameters' dtype (fp32 or fp64).
struct GraphOut {
  at::Tensor hidden;       // [N, γ, d]  h_k, post final norm
  at::Tensor logits;       // [N, γ, V'] U_k + B_k (draft logits, Eq. 4); V' = V, or
                           //            |draft_vocab| with row i ↔ token draft_vocab[i]
  at::Tensor conf_logits;  // [N, γ]     z_k (confidence logits, Eq. 7)
};

class DrafterGraph {
 public:
  /// `cfg` must be complete (validated; throws InvalidArgument otherwise).
  /// `embedding` and `lm_head` are the target's frozen [V, d] tables (any
  /// floating dtype, usually bf16; TargetModel::embedding() / lm_head()).
  /// They are referenced, not copied, except for per-dtype conversions made
  /// on first use; with a draft vocabulary its rows of `lm_head` are gathered
  /// once here (the rest of the head is never used). Throws InvalidArgument
  /// when their shapes are not [V, d].
  DrafterGraph(DrafterConfig cfg, at::Tensor embedding, at::Tensor lm_head, GraphOptions opts = {});

  const DrafterConfig& config() const { return cfg_; }
  const GraphOptions& options() const { return opts_; }

  /// The teacher-forced forward for N anchors of one sequence.
  ///   params       every tensor of Drafter::param_spec(cfg), fp32 or fp64 (all
  ///                the same dtype); gradients flow into those that require it.
  ///   ctx_feats    [L, m*d] the target's tapped hidden states of positions
  ///                0..L-1 of the sequence (any floating dtype; no gradient).
  ///   anchors      [N] int64 anchor positions p_i, 0 <= p_i <= L; anchor i
  ///                attends to context rows 0..p_i-1 only.
  ///   prev_tokens  [N, γ'] int64 (1 <= γ' <= kMaxGamma): column 0 is the
  ///                anchor token, column k the token preceding slot k
  ///                (teacher forcing: the ground truth tokens[p_i + k]).
  /// Returns hidden/logits/conf_logits for γ' slots (logits over the output
  /// vocabulary, see out_vocab()). Throws InvalidArgument
  /// for a missing parameter, mixed dtypes, or any shape/range violation
  /// (token ids outside [0, V), anchors outside [0, L]).
  GraphOut forward(const ParamMap& params, const at::Tensor& ctx_feats, const at::Tensor& anchors,
                   const at::Tensor& prev_tokens) const;

  /// y = x · Wᵀ for x [..., K], W [O, K] under the configured precision
  /// (see MatmulPrecision). Differentiable in x and W.
  at::Tensor linear(const at::Tensor& x, const at::Tensor& W) const;

  /// Batched a · b (at::matmul broadcasting) under the configured precision.
  at::Tensor bmm(const at::Tensor& a, const at::Tensor& b) const;

  /// The frozen LM head applied to h [..., d]: [..., V'] in h's dtype (only
  /// the draft-vocabulary rows when there is one). The head never receives a
  /// gradient; h does. With bf16 precision this is a bf16 product (above);
  /// on a CPU without oneDNN's bf16 products it runs on the inference kernel
  /// (bf16 inputs, fp32 accumulation and output), as Drafter::draft computes
  /// U for a bf16 target.
  at::Tensor lm_head(const at::Tensor& h) const;

  /// V': the number of logit rows (|draft_vocab|, or V without one).
  int64_t out_vocab() const { return head_.size(0); }
  /// [V'] int64 token id of each logit row (the draft vocabulary), or an
  /// undefined tensor without a draft vocabulary (row = token id).
  const at::Tensor& vocab_ids() const { return rows_; }
  /// The frozen LM head rows behind the logits: [V', d] in the dtype it was
  /// given (for target_probs_sub, which must use the same rows).
  const at::Tensor& head_rows() const { return head_; }

 private:
  const at::Tensor& frozen(const at::Tensor& src, at::ScalarType dtype, int which) const;
  DrafterConfig cfg_;
  at::Tensor embed_, head_;  // head_: [V', d], the draft-vocabulary rows when there is one
  at::Tensor rows_;          // [V'] int64 draft vocabulary (undefined: none)
  GraphOptions opts_;
  // Converted copies of the frozen tables, by dtype: [0] embedding, [1] head.
  mutable std::map<at::ScalarType, at::Tensor> frozen_cache_[2];
  mutable at::Tensor headT_;  // [d, V' rounded up to 32] bf16, the head transposed (backward)
};

}  // namespace dspark::train
