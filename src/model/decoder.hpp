// The forward pass every decoder-only target family shares, written once:
// validation of a ragged batch, positions, the embedding (with the family's
// scale), hidden-state taps, KV-cache writes and attention (full or sliding
// window), the final norm and the LM head (with the family's logit softcap).
// A family file holds only what differs: its config, its tensor registry and
// the body of one block.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "dspark/io/gguf.hpp"
#include "dspark/model/target.hpp"
#include "dspark/ops/linear.hpp"
#include "hparams.hpp"
#include "weights.hpp"

namespace dspark {

class DecoderModel : public TargetModel {
 public:
  const TargetInfo& info() const override { return info_; }
  const ops::Linear& embedding_table() const override { return embd_; }
  const ops::Linear& head() const override { return tied_ ? embd_ : head_; }
  const at::Tensor& output_norm() const override { return out_norm_; }

  std::vector<ForwardOut> forward(std::span<ForwardSeq> batch, const TapRequest& taps) final;

 protected:
  explicit DecoderModel(std::shared_ptr<const io::GGUFFile> f) : file_(std::move(f)) {}

  /// The rows of one forward call: sequence s owns rows row0[s] .. row0[s+1]-1.
  struct Rows {
    std::span<ForwardSeq> seqs;
    std::vector<int64_t> row0;  // [S + 1]
    std::vector<int64_t> pos;   // [N] absolute position of each row
    int64_t n() const { return row0.back(); }
  };

  /// The sizes a block works with: rows N, hidden d, heads H and Hkv, head
  /// dim hd, MLP width F, fused q|k|v width Oqkv = (H + 2·Hkv)·hd; RMSNorm eps.
  struct Dims {
    int64_t N, d, H, Hkv, hd, F, Oqkv;
    float eps;
  };
  Dims dims(const Rows& rows) const {
    const int64_t H = info_.n_heads, Hkv = info_.n_kv_heads, hd = info_.head_dim;
    return {rows.n(), info_.hidden, H, Hkv, hd, info_.ffn, (H + 2 * Hkv) * hd, static_cast<float>(info_.rms_eps)};
  }

  /// Applies block `l` to the residual stream x [N, d] fp32 in place; may use `buf_`.
  virtual void block(int64_t l, const Rows& rows, float* x) = 0;

  /// Activations a block works in, sized for the call's N rows before the
  /// first block: xn [N, max(d, H·hd, F)] (matmul inputs), wide
  /// [N, max((H + 2·Hkv)·hd, 2F)] (q|k|v, gate|up), tmp [N, d]. One per
  /// thread: a model may run forward passes on several threads at once (the
  /// serving engine's and its callers').
  struct Scratch {
    std::vector<float> xn, wide, tmp;
  };
  static thread_local Scratch buf_;

  /// Layer l's attention for every sequence: writes the new keys and values
  /// of `qkv` ([N, (H + 2 Hkv) · hd] rows of stride `ld`: q heads, k heads,
  /// v heads, RoPE already applied) into the caches and attends causally —
  /// to every earlier position, or to the layer's sliding window. out: [N, H · hd].
  void attend(int64_t l, const Rows& rows, const float* qkv, int64_t ld, float scale, float* out) const;

  /// The weights of a Llama-style block (block_tensors in weights.hpp).
  struct BlockWeights {
    at::Tensor attn_norm;       // [d] fp32
    at::Tensor q_norm, k_norm;  // [hd] fp32 per-head norms; undefined in families without them
    ops::Linear wqkv;           // [(H + 2*Hkv) * hd, d]: q rows, then k, then v
    ops::Linear wo;             // [d, H * hd]
    at::Tensor ffn_norm;        // [d] fp32
    ops::Linear wgu;            // [2F, d]: gate rows, then up
    ops::Linear wdown;          // [d, F]
  };
  /// Loads layer l's tensors of block_tensors(info_, qk_norm) from `w`.
  static BlockWeights load_block(const Weights& w, int64_t l, bool qk_norm);
  /// Returns l; throws InvalidArgument unless 0 <= l < n_layers.
  int64_t check_layer(int64_t l) const;
  /// The LayerRecipe of a Llama-style block (SwiGLU, no post norms) l
  /// (checked by the caller): the block's weights and the RoPE and attention
  /// constants given.
  LayerRecipe block_recipe(int64_t l, const BlockWeights& b, bool rope_halves, const std::vector<float>& inv_freq,
                           float attn_scale) const;

  /// What a family does to q and k between the projection and attention
  /// (RoPE, per-head norms): qkv is [N, (H + 2 Hkv) · hd] of row stride ld.
  using QKTransform = std::function<void(float* qkv, int64_t ld)>;

  /// A Llama-style block on the residual stream x [N, d] fp32, in place:
  /// x += W_o · attention(qk(W_qkv · RMSNorm(x))) with attention scale
  /// `scale`, then x += W_down · (silu(W_gate h) ⊙ W_up h), h = RMSNorm(x).
  /// Uses `buf_`.
  void llama_block(int64_t l, const Rows& rows, float* x, const BlockWeights& L, float scale,
                   const QKTransform& qk) const;

  /// Takes the parsed config (info_, rot_dim_), checks the family's tensor
  /// registry together with the shared tensors — token_embd [V, d],
  /// output_norm [d], output [V, d] (optional: tied to the embedding) — and
  /// loads the shared ones. Returns the registry for the family's own tensors.
  Weights load_weights(const DecoderConfig& config, std::vector<TensorSpec> family, ops::Compute compute);

  std::shared_ptr<const io::GGUFFile> file_;  // quantized weights point into its mapping
  TargetInfo info_;
  int64_t rot_dim_ = 0;  // RoPE dimensions of each head

 private:
  ops::Linear embd_, head_;  // head_ unused when tied_
  bool tied_ = false;
  at::Tensor out_norm_;
};

}  // namespace dspark
