// Llama-family target (Touvron et al. 2023): per layer RMSNorm -> grouped-query
// attention with RoPE -> residual -> RMSNorm -> SwiGLU MLP -> residual; the
// embedding, final norm and LM head (tied or separate) are the shared
// decoder's (decoder.hpp).
//
// GGUF conventions (ggml convert_hf_to_gguf): Q/K rows are permuted so that
// RoPE rotates adjacent pairs (2i, 2i+1); tensors are named blk.N.attn_q etc.
// Matmuls run on the GGUF's quantized blocks with int8 activations
// (ops::Compute::Quant) or on bf16 copies (Compute::BF16), with fp32
// outputs; the residual stream, norms, softmax and RoPE are fp32.
#include <cmath>

#include "decoder.hpp"
#include "dspark/ops/kernels.hpp"
#include "dspark/ops/rope.hpp"
#include "families.hpp"
#include "hparams.hpp"

namespace dspark {

namespace {

struct LlamaConfig {
  DecoderConfig base;
  bool has_rope_factors = false;  // rope_freqs.weight: Llama 3 per-dimension frequency factors
};

LlamaConfig parse_llama_config(const io::GGUFFile& f) {
  LlamaConfig c;
  c.base = parse_decoder_config(ArchKeys(f, "llama"));
  c.has_rope_factors = f.find_tensor("rope_freqs.weight") != nullptr;
  return c;
}

std::vector<TensorSpec> llama_tensors(const LlamaConfig& c) {
  std::vector<TensorSpec> s = block_tensors(c.base.info, false);
  s.push_back({"rope_freqs.weight", {c.base.rot_dim / 2}, false});
  return s;
}

class LlamaModel final : public DecoderModel {
 public:
  LlamaModel(std::shared_ptr<const io::GGUFFile> f, ops::Compute compute) : DecoderModel(std::move(f)) {
    const LlamaConfig c = parse_llama_config(*file_);
    const Weights w = load_weights(c.base, llama_tensors(c), compute);
    const at::Tensor factors = c.has_rope_factors ? w.vector("rope_freqs.weight") : at::Tensor();
    inv_freq_ = ops::rope_inv_freq(info_.rope_base, rot_dim_, c.base.rope_linear,
                                   factors.defined() ? factors.data_ptr<float>() : nullptr);
    for (int64_t l = 0; l < info_.n_layers; ++l) layers_.push_back(load_block(w, l, false));
  }

  LayerRecipe layer_recipe(int64_t l) const override {
    return block_recipe(l, layers_[static_cast<size_t>(check_layer(l))], false, inv_freq_,
                        1.0f / std::sqrt(static_cast<float>(info_.head_dim)));
  }

 private:
  void block(int64_t l, const Rows& rows, float* x) override {
    const int64_t N = rows.n(), H = info_.n_heads, Hkv = info_.n_kv_heads, hd = info_.head_dim;
    // RoPE on adjacent pairs of q and k; attention scale 1/sqrt(hd).
    llama_block(l, rows, x, layers_[static_cast<size_t>(l)], 1.0f / std::sqrt(static_cast<float>(hd)),
                [&](float* qkv, int64_t ld) {
                  ops::rope_pairs(qkv, N, ld, H, hd, rot_dim_, rows.pos.data(), inv_freq_.data());
                  ops::rope_pairs(qkv + H * hd, N, ld, Hkv, hd, rot_dim_, rows.pos.data(), inv_freq_.data());
                });
  }

  std::vector<float> inv_freq_;  // [rot_dim / 2]
  std::vector<BlockWeights> layers_;
};

}  // namespace

std::unique_ptr<TargetModel> make_llama(std::shared_ptr<const io::GGUFFile> file, ops::Compute compute) {
  return std::make_unique<LlamaModel>(std::move(file), compute);
}

}  // namespace dspark
