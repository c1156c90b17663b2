// Gemma 3 text target (Gemma Team 2025, "Gemma 3 Technical Report"): the
// embedding scaled by sqrt(d); per layer RMSNorm -> attention with per-head
// q/k RMSNorm and RoPE -> RMSNorm (post-attention) -> residual -> RMSNorm ->
// GeGLU MLP (GELU-tanh gate) -> RMSNorm (post-FFN) -> residual; final RMSNorm
// and the tied LM head, with an optional final logit softcap. Local layers
// attend to a sliding window (RoPE base 10,000), one global layer follows
// every five (RoPE base and scaling from the GGUF). The embedding, taps, KV
// cache writes, final norm and LM head are the shared decoder's (decoder.hpp).
//
// GGUF conventions (llama.cpp convert_hf_to_gguf, Gemma3Model): norm weights
// are stored as 1 + w (Gemma's RMSNorm multiplies by 1 + w), so they apply
// as plain RMSNorm weights here; Q/K rows are not permuted, so RoPE rotates
// the two halves of each head (NeoX layout).
#include <cmath>

#include "decoder.hpp"
#include "dspark/error.hpp"
#include "dspark/ops/activations.hpp"
#include "dspark/ops/head_norm.hpp"
#include "dspark/ops/kernels.hpp"
#include "dspark/ops/rope.hpp"
#include "families.hpp"
#include "hparams.hpp"

namespace dspark {

namespace {

struct Gemma3Config {
  DecoderConfig base;
  std::vector<bool> local;         // [n_layers]: sliding-window layer
  int64_t window = 0;              // attention.sliding_window: keys a local layer sees
  double local_rope_base = 10000;  // rope.freq_base_swa
  float attn_scale = 0;            // 1 / sqrt(query_pre_attn_scalar)
};

Gemma3Config parse_gemma3_config(const io::GGUFFile& f) {
  const ArchKeys k(f, "gemma3");
  Gemma3Config c;
  c.base = parse_decoder_config(k);
  TargetInfo& i = c.base.info;
  i.embed_scale = std::sqrt(static_cast<float>(i.hidden));
  i.logit_softcap = k.get_float_or("final_logit_softcapping", 0.0);
  if (!(i.logit_softcap >= 0) || !std::isfinite(i.logit_softcap))
    throw FormatError(f.path() + ": " + k.key("final_logit_softcapping") + " must be >= 0, got " +
                      std::to_string(i.logit_softcap));
  // query_pre_attn_scalar is the key length, except for Gemma 3 27B (62
  // layers), where it is d / H (gemma_pytorch config.py; llama.cpp likewise).
  const int64_t qpa = i.n_layers == 62 ? i.hidden / i.n_heads : i.head_dim;
  c.attn_scale = 1.0f / std::sqrt(static_cast<float>(qpa));
  c.window = k.get_int_or("attention.sliding_window", 0);
  if (c.window < 0)
    throw FormatError(f.path() + ": " + k.key("attention.sliding_window") + " must be >= 0, got " +
                      std::to_string(c.window));
  c.local.assign(static_cast<size_t>(i.n_layers), false);
  if (c.window > 0) {
    // Which layers are local: an explicit per-layer array, or a period P
    // (default 6) whose last layer is global: layer l is local iff l % P < P - 1.
    const std::string pk = k.key("attention.sliding_window_pattern");
    const io::GGUFValue* v = f.find(pk);
    if (v && v->type == io::GGUFValueType::ARRAY) {
      const auto& a = v->as_array();
      if (static_cast<int64_t>(a.size()) != i.n_layers)
        throw FormatError(f.path() + ": " + pk + " has " + std::to_string(a.size()) + " entries for " +
                          std::to_string(i.n_layers) + " layers");
      for (size_t l = 0; l < a.size(); ++l) {
        try {
          c.local[l] = a[l].as_bool();
        } catch (const FormatError& e) {
          throw FormatError(f.path() + ": key '" + pk + "'[" + std::to_string(l) + "]: " + e.what());
        }
      }
    } else {
      const int64_t P = v ? f.get_int(pk) : 6;  // a type error names the key and the file
      if (P < 0) throw FormatError(f.path() + ": " + pk + " must be >= 0, got " + std::to_string(P));
      for (int64_t l = 0; l < i.n_layers; ++l) c.local[static_cast<size_t>(l)] = P == 0 || l % P < P - 1;
    }
    c.local_rope_base = k.positive_float("rope.freq_base_swa", 10000.0);
    for (int64_t l = 0; l < i.n_layers; ++l)
      if (c.local[static_cast<size_t>(l)]) i.layer_window[static_cast<size_t>(l)] = c.window;
  }
  return c;
}

std::vector<TensorSpec> gemma3_tensors(const TargetInfo& i) {
  std::vector<TensorSpec> s = block_tensors(i, true);
  for (int64_t l = 0; l < i.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    s.insert(s.end(), {{p + "post_attention_norm.weight", {i.hidden}}, {p + "post_ffw_norm.weight", {i.hidden}}});
  }
  return s;
}

class Gemma3Model final : public DecoderModel {
 public:
  Gemma3Model(std::shared_ptr<const io::GGUFFile> f, ops::Compute compute) : DecoderModel(std::move(f)) {
    const Gemma3Config c = parse_gemma3_config(*file_);
    const Weights w = load_weights(c.base, gemma3_tensors(c.base.info), compute);
    attn_scale_ = c.attn_scale;
    global_freq_ = ops::rope_inv_freq(info_.rope_base, rot_dim_, c.base.rope_linear);
    local_freq_ = ops::rope_inv_freq(c.local_rope_base, rot_dim_);
    for (int64_t l = 0; l < info_.n_layers; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      layers_.push_back(
          {load_block(w, l, true), w.vector(p + "post_attention_norm.weight"), w.vector(p + "post_ffw_norm.weight")});
    }
  }

  LayerRecipe layer_recipe(int64_t l) const override {
    const Layer& layer = layers_[static_cast<size_t>(check_layer(l))];
    const bool local = info_.layer_window[static_cast<size_t>(l)] > 0;
    LayerRecipe r = block_recipe(l, layer.b, true, local ? local_freq_ : global_freq_, attn_scale_);
    r.post_attn_norm = layer.post_attn_norm;
    r.post_ffn_norm = layer.post_ffn_norm;
    r.gelu = true;
    return r;
  }

 private:
  void block(int64_t l, const Rows& rows, float* x) override {
    const auto [N, d, H, Hkv, hd, F, Oqkv, eps] = dims(rows);
    const Layer& layer = layers_[static_cast<size_t>(l)];
    const BlockWeights& L = layer.b;
    const float* freq = info_.layer_window[static_cast<size_t>(l)] > 0 ? local_freq_.data() : global_freq_.data();
    float *xn = buf_.xn.data(), *wide = buf_.wide.data(), *tmp = buf_.tmp.data();
    // Attention block: x += post_attn_norm(W_o · attn(rope(q_norm(q)), rope(k_norm(k)), v)).
    ops::rmsnorm_f32(x, L.attn_norm.data_ptr<float>(), N, d, eps, xn);
    L.wqkv.forward(xn, N, wide, Oqkv);
    ops::head_rmsnorm(wide, N, Oqkv, H, hd, L.q_norm.data_ptr<float>(), eps);
    ops::head_rmsnorm(wide + H * hd, N, Oqkv, Hkv, hd, L.k_norm.data_ptr<float>(), eps);
    ops::rope_halves(wide, N, Oqkv, H, hd, rot_dim_, rows.pos.data(), freq);
    ops::rope_halves(wide + H * hd, N, Oqkv, Hkv, hd, rot_dim_, rows.pos.data(), freq);
    attend(l, rows, wide, Oqkv, attn_scale_, xn);
    L.wo.forward(xn, N, tmp, d);
    ops::rmsnorm_f32(tmp, layer.post_attn_norm.data_ptr<float>(), N, d, eps, tmp);
    ops::add_rows(x, tmp, N, d, d);
    // MLP block: x += post_ffn_norm(W_down · (gelu_tanh(W_gate h) ⊙ W_up h)), h = ffn_norm(x).
    ops::rmsnorm_f32(x, L.ffn_norm.data_ptr<float>(), N, d, eps, xn);
    L.wgu.forward(xn, N, wide, 2 * F);
    ops::gelu_tanh_mul(wide, N, F, xn);
    L.wdown.forward(xn, N, tmp, d);
    ops::rmsnorm_f32(tmp, layer.post_ffn_norm.data_ptr<float>(), N, d, eps, tmp);
    ops::add_rows(x, tmp, N, d, d);
  }

  struct Layer {
    BlockWeights b;                            // the Llama-style weights, with q/k norms
    at::Tensor post_attn_norm, post_ffn_norm;  // [d] fp32
  };

  float attn_scale_ = 0;
  std::vector<float> global_freq_, local_freq_;  // [rot_dim / 2] each
  std::vector<Layer> layers_;
};

}  // namespace

std::unique_ptr<TargetModel> make_gemma3(std::shared_ptr<const io::GGUFFile> file, ops::Compute compute) {
  return std::make_unique<Gemma3Model>(std::move(file), compute);
}

}  // namespace dspark
