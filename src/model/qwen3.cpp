// Qwen3 dense target (Qwen Team 2025, "Qwen3 Technical Report"): the Llama
// block — RMSNorm -> grouped-query attention -> residual -> RMSNorm -> SwiGLU
// MLP -> residual — with a per-head RMSNorm of q and of k before RoPE
// (replacing Qwen2's q/k/v biases). The embedding, final norm and LM head
// (tied when the GGUF has no output.weight, as in the small models) are the
// shared decoder's (decoder.hpp).
//
// GGUF conventions (llama.cpp convert_hf_to_gguf, Qwen3Model): Q/K rows are
// not permuted, so RoPE rotates the two halves of each head (NeoX layout);
// the head dimension is attention.key_length, which need not be d / H
// (Qwen3-0.6B: d = 1024, 16 heads of 128); norms hold plain RMSNorm weights.
// Matmuls run on quantized blocks or bf16 copies exactly as for Llama.
#include <cmath>

#include "decoder.hpp"
#include "dspark/ops/head_norm.hpp"
#include "dspark/ops/rope.hpp"
#include "families.hpp"
#include "hparams.hpp"

namespace dspark {

namespace {

class Qwen3Model final : public DecoderModel {
 public:
  Qwen3Model(std::shared_ptr<const io::GGUFFile> f, ops::Compute compute) : DecoderModel(std::move(f)) {
    const DecoderConfig c = parse_decoder_config(ArchKeys(*file_, "qwen3"));
    const Weights w = load_weights(c, block_tensors(c.info, true), compute);
    inv_freq_ = ops::rope_inv_freq(info_.rope_base, rot_dim_, c.rope_linear);
    for (int64_t l = 0; l < info_.n_layers; ++l) layers_.push_back(load_block(w, l, true));
  }

  LayerRecipe layer_recipe(int64_t l) const override {
    return block_recipe(l, layers_[static_cast<size_t>(check_layer(l))], true, inv_freq_,
                        1.0f / std::sqrt(static_cast<float>(info_.head_dim)));
  }

 private:
  void block(int64_t l, const Rows& rows, float* x) override {
    const int64_t N = rows.n(), H = info_.n_heads, Hkv = info_.n_kv_heads, hd = info_.head_dim;
    const float eps = static_cast<float>(info_.rms_eps);
    const BlockWeights& L = layers_[static_cast<size_t>(l)];
    // Per-head RMSNorm of q and of k, then RoPE on head halves; attention scale 1/sqrt(hd).
    llama_block(l, rows, x, L, 1.0f / std::sqrt(static_cast<float>(hd)), [&](float* qkv, int64_t ld) {
      ops::head_rmsnorm(qkv, N, ld, H, hd, L.q_norm.data_ptr<float>(), eps);
      ops::head_rmsnorm(qkv + H * hd, N, ld, Hkv, hd, L.k_norm.data_ptr<float>(), eps);
      ops::rope_halves(qkv, N, ld, H, hd, rot_dim_, rows.pos.data(), inv_freq_.data());
      ops::rope_halves(qkv + H * hd, N, ld, Hkv, hd, rot_dim_, rows.pos.data(), inv_freq_.data());
    });
  }

  std::vector<float> inv_freq_;  // [rot_dim / 2]
  std::vector<BlockWeights> layers_;
};

}  // namespace

std::unique_ptr<TargetModel> make_qwen3(std::shared_ptr<const io::GGUFFile> file, ops::Compute compute) {
  return std::make_unique<Qwen3Model>(std::move(file), compute);
}

}  // namespace dspark
