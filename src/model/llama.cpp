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
  const TargetInfo& i = c.base.info;
  const int64_t d = i.hidden, q = i.n_heads * i.head_dim, kv = i.n_kv_heads * i.head_dim, F = i.ffn;
  std::vector<TensorSpec> s = {{"rope_freqs.weight", {c.base.rot_dim / 2}, false}};
  for (int64_t l = 0; l < i.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    s.insert(s.end(), {{p + "attn_norm.weight", {d}},   {p + "attn_q.weight", {q, d}},
                       {p + "attn_k.weight", {kv, d}},  {p + "attn_v.weight", {kv, d}},
                       {p + "attn_output.weight", {d, q}}, {p + "ffn_norm.weight", {d}},
                       {p + "ffn_gate.weight", {F, d}}, {p + "ffn_up.weight", {F, d}},
                       {p + "ffn_down.weight", {d, F}}});
  }
  return s;
}

struct LlamaLayer {
  at::Tensor attn_norm;  // [d] fp32
  ops::Linear wqkv;      // [(H + 2*Hkv) * hd, d]: q rows, then k, then v
  ops::Linear wo;        // [d, H * hd]
  at::Tensor ffn_norm;   // [d] fp32
  ops::Linear wgu;       // [2F, d]: gate rows, then up
  ops::Linear wdown;     // [d, F]
};

class LlamaModel final : public DecoderModel {
 public:
  LlamaModel(std::shared_ptr<const io::GGUFFile> f, ops::Compute compute) : DecoderModel(std::move(f)) {
    const LlamaConfig c = parse_llama_config(*file_);
    const Weights w = load_weights(c.base, llama_tensors(c), compute);
    const at::Tensor factors = c.has_rope_factors ? w.vector("rope_freqs.weight") : at::Tensor();
    inv_freq_ = ops::rope_inv_freq(info_.rope_base, rot_dim_, c.base.rope_linear,
                                   factors.defined() ? factors.data_ptr<float>() : nullptr);
    for (int64_t l = 0; l < info_.n_layers; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      layers_.push_back({w.vector(p + "attn_norm.weight"),
                         w.linear({p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"}),
                         w.linear({p + "attn_output.weight"}), w.vector(p + "ffn_norm.weight"),
                         w.linear({p + "ffn_gate.weight", p + "ffn_up.weight"}), w.linear({p + "ffn_down.weight"})});
    }
  }

 private:
  void block(int64_t l, const Rows& rows, float* x) override {
    const auto [N, d, H, Hkv, hd, F, Oqkv, eps] = dims(rows);
    const auto& L = layers_[static_cast<size_t>(l)];
    float *xn = buf_.xn.data(), *wide = buf_.wide.data(), *tmp = buf_.tmp.data();
    // Attention block.
    ops::rmsnorm_f32(x, L.attn_norm.data_ptr<float>(), N, d, eps, xn);
    L.wqkv.forward(xn, N, wide, Oqkv);
    ops::rope_pairs(wide, N, Oqkv, H, hd, rot_dim_, rows.pos.data(), inv_freq_.data());
    ops::rope_pairs(wide + H * hd, N, Oqkv, Hkv, hd, rot_dim_, rows.pos.data(), inv_freq_.data());
    attend(l, rows, wide, Oqkv, 1.0f / std::sqrt(static_cast<float>(hd)), xn);
    L.wo.forward(xn, N, tmp, d);
    ops::add_rows(x, tmp, N, d, d);
    // MLP block.
    ops::rmsnorm_f32(x, L.ffn_norm.data_ptr<float>(), N, d, eps, xn);
    L.wgu.forward(xn, N, wide, 2 * F);
    ops::silu_mul(wide, N, F, xn);
    L.wdown.forward(xn, N, tmp, d);
    ops::add_rows(x, tmp, N, d, d);
  }

  std::vector<float> inv_freq_;  // [rot_dim / 2]
  std::vector<LlamaLayer> layers_;
};

}  // namespace

std::unique_ptr<TargetModel> make_llama(std::shared_ptr<const io::GGUFFile> file, ops::Compute compute) {
  return std::make_unique<LlamaModel>(std::move(file), compute);
}

}  // namespace dspark
