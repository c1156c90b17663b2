// Llama-family forward pass (Touvron et al. 2023): token embedding, per layer
// RMSNorm -> grouped-query attention with RoPE -> residual -> RMSNorm ->
// SwiGLU MLP -> residual, final RMSNorm, LM head (tied or separate).
//
// GGUF conventions (ggml convert_hf_to_gguf): Q/K rows are permuted so that
// RoPE rotates adjacent pairs (2i, 2i+1); tensors are named blk.N.attn_q etc.
// Matmuls run on the GGUF's quantized blocks with int8 activations
// (ops::Compute::Quant) or on bf16 copies (Compute::BF16), with fp32
// outputs; the residual stream, norms, softmax and RoPE are fp32.
#include "llama.hpp"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "dspark/error.hpp"
#include "dspark/io/dequant.hpp"
#include "dspark/ops/kernels.hpp"
#include "dspark/ops/linear.hpp"

namespace dspark {

namespace {

struct LlamaLayer {
  at::Tensor attn_norm;  // [d] fp32
  ops::Linear wqkv;      // [(H + 2*Hkv) * hd, d]: q rows, then k, then v
  ops::Linear wo;        // [d, H * hd]
  at::Tensor ffn_norm;   // [d] fp32
  ops::Linear wgu;       // [2F, d]: gate rows, then up
  ops::Linear wdown;     // [d, F]
};

class LlamaModel final : public TargetModel {
 public:
  LlamaModel(std::shared_ptr<const io::GGUFFile> f, ops::Compute compute) : file_(std::move(f)) {
    load(*file_, compute);
  }

  const TargetInfo& info() const override { return info_; }
  const ops::Linear& embedding_table() const override { return embd_; }
  const ops::Linear& head() const override { return tied_ ? embd_ : head_; }
  const at::Tensor& output_norm() const override { return out_norm_; }

  std::vector<ForwardOut> forward(std::span<ForwardSeq> batch, const TapRequest& taps) override;

 private:
  void load(const io::GGUFFile& f, ops::Compute compute);

  std::shared_ptr<const io::GGUFFile> file_;  // quantized weights point into its mapping
  TargetInfo info_;
  int64_t rot_dim_ = 0;
  std::vector<float> inv_freq_;  // [rot_dim / 2]
  ops::Linear embd_, head_;  // head_ unused when tied_
  bool tied_ = false;
  at::Tensor out_norm_;
  std::vector<LlamaLayer> layers_;
};

std::string key(const std::string& arch, const char* suffix) { return arch + "." + suffix; }

at::Tensor load_f32(const io::GGUFFile& f, const std::string& name, int64_t n) {
  const auto& t = f.tensor(name);
  if (t.n_elements() != n)
    throw FormatError(f.path() + ": tensor '" + name + "' has " + std::to_string(t.n_elements()) +
                      " elements, expected " + std::to_string(n));
  return io::dequantize_tensor(t, at::kFloat).reshape({n});
}

void LlamaModel::load(const io::GGUFFile& f, ops::Compute compute) {
  const std::string arch = f.get_string("general.architecture");
  info_.arch = arch;
  info_.path = f.path();
  info_.n_layers = f.get_int(key(arch, "block_count"));
  info_.hidden = f.get_int(key(arch, "embedding_length"));
  info_.n_heads = f.get_int(key(arch, "attention.head_count"));
  info_.n_kv_heads = f.get_int_or(key(arch, "attention.head_count_kv"), info_.n_heads);
  if (info_.n_heads <= 0 || info_.hidden <= 0)
    throw FormatError(f.path() + ": " + key(arch, "attention.head_count") + " and " + key(arch, "embedding_length") +
                      " must be positive, got " + std::to_string(info_.n_heads) + " and " +
                      std::to_string(info_.hidden));
  info_.head_dim = f.get_int_or(key(arch, "attention.key_length"), info_.hidden / info_.n_heads);
  info_.ffn = f.get_int(key(arch, "feed_forward_length"));
  info_.context = f.get_int_or(key(arch, "context_length"), 2048);
  info_.rms_eps = f.get_float_or(key(arch, "attention.layer_norm_rms_epsilon"), 1e-5);
  info_.rope_base = f.get_float_or(key(arch, "rope.freq_base"), 10000.0);
  rot_dim_ = f.get_int_or(key(arch, "rope.dimension_count"), info_.head_dim);

  const auto& emb_info = f.tensor("token_embd.weight");
  info_.vocab = emb_info.shape().at(0);
  constexpr int64_t kMaxLayers = 4096;  // far above any released model; guards the allocations below
  if (info_.n_layers <= 0 || info_.n_layers > kMaxLayers || info_.n_kv_heads <= 0 || info_.head_dim <= 0 ||
      info_.n_heads % info_.n_kv_heads != 0 || rot_dim_ <= 0 || rot_dim_ % 2 != 0 || rot_dim_ > info_.head_dim) {
    throw FormatError(f.path() + ": inconsistent llama hyper-parameters (layers " +
                      std::to_string(info_.n_layers) + ", heads " + std::to_string(info_.n_heads) +
                      "/" + std::to_string(info_.n_kv_heads) + ", rope dims " +
                      std::to_string(rot_dim_) + ")");
  }
  const auto positive_finite = [&](double v, const char* name) {
    if (!(v > 0) || !std::isfinite(v))
      throw FormatError(f.path() + ": " + key(arch, name) + " must be a positive finite number, got " +
                        std::to_string(v));
  };
  positive_finite(info_.rms_eps, "attention.layer_norm_rms_epsilon");
  positive_finite(info_.rope_base, "rope.freq_base");
  if (info_.context <= 0 || info_.ffn <= 0)
    throw FormatError(f.path() + ": " + key(arch, "context_length") + " and " + key(arch, "feed_forward_length") +
                      " must be positive, got " + std::to_string(info_.context) + " and " +
                      std::to_string(info_.ffn));
  if (f.find(key(arch, "vocab_size")) && f.get_int(key(arch, "vocab_size")) != info_.vocab)
    throw FormatError(f.path() + ": " + key(arch, "vocab_size") + " is " +
                      std::to_string(f.get_int(key(arch, "vocab_size"))) + " but token_embd.weight has " +
                      std::to_string(info_.vocab) + " rows");
  for (int64_t dim : {info_.hidden, info_.ffn, info_.n_heads * info_.head_dim}) {
    if (dim % 32 != 0)
      throw FormatError(f.path() + ": dimension " + std::to_string(dim) +
                        " is not a multiple of 32, which the matmul kernels require");
  }

  // Identity used to pair drafters with targets: the model, not its quantization.
  std::string id = f.find("general.basename") ? f.get_string("general.basename") : "";
  if (id.empty() && f.find("general.name")) id = f.get_string("general.name");
  if (auto* v = f.find("general.size_label")) id += "-" + v->as_string();
  if (auto* v = f.find("general.finetune")) id += "-" + v->as_string();
  info_.id = arch + "/" + id;

  // RoPE frequencies, with optional linear scaling and per-dim factors (Llama 3).
  const std::string scaling = f.find(key(arch, "rope.scaling.type"))
                                  ? f.get_string(key(arch, "rope.scaling.type"))
                                  : "none";
  double linear = 1.0;
  if (scaling == "linear") {
    linear = f.get_float_or(key(arch, "rope.scaling.factor"), 1.0);
  } else if (scaling != "none") {
    throw FormatError(f.path() + ": unsupported rope scaling '" + scaling +
                      "' (supported: none, linear)");
  }
  inv_freq_.resize(static_cast<size_t>(rot_dim_ / 2));
  const at::Tensor factors = f.find_tensor("rope_freqs.weight")
                                 ? load_f32(f, "rope_freqs.weight", rot_dim_ / 2)
                                 : at::ones({rot_dim_ / 2});
  for (int64_t i = 0; i < rot_dim_ / 2; ++i) {
    inv_freq_[i] = static_cast<float>(
        std::pow(info_.rope_base, -2.0 * static_cast<double>(i) / static_cast<double>(rot_dim_)) /
        linear / factors[i].item<float>());
  }

  const int64_t d = info_.hidden, H = info_.n_heads, Hkv = info_.n_kv_heads, hd = info_.head_dim,
                F = info_.ffn, V = info_.vocab;
  info_.compute = ops::to_string(compute);
  auto lin = [&](std::vector<std::string> names, std::vector<int64_t> rows, int64_t cols) {
    return ops::Linear::load(f, names, rows, cols, compute);
  };
  embd_ = lin({"token_embd.weight"}, {V}, d);
  tied_ = f.find_tensor("output.weight") == nullptr;
  if (!tied_) head_ = lin({"output.weight"}, {V}, d);
  out_norm_ = load_f32(f, "output_norm.weight", d);
  layers_.resize(static_cast<size_t>(info_.n_layers));
  for (int64_t l = 0; l < info_.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    auto& L = layers_[static_cast<size_t>(l)];
    L.attn_norm = load_f32(f, p + "attn_norm.weight", d);
    L.ffn_norm = load_f32(f, p + "ffn_norm.weight", d);
    L.wqkv = lin({p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"}, {H * hd, Hkv * hd, Hkv * hd}, d);
    L.wo = lin({p + "attn_output.weight"}, {d}, H * hd);
    L.wgu = lin({p + "ffn_gate.weight", p + "ffn_up.weight"}, {F, F}, d);
    L.wdown = lin({p + "ffn_down.weight"}, {d}, F);
  }
}

std::vector<ForwardOut> LlamaModel::forward(std::span<ForwardSeq> batch, const TapRequest& taps) {
  const int64_t d = info_.hidden, H = info_.n_heads, Hkv = info_.n_kv_heads, hd = info_.head_dim,
                F = info_.ffn, V = info_.vocab;
  const int64_t Oqkv = (H + 2 * Hkv) * hd;
  const int64_t n_seq = static_cast<int64_t>(batch.size());

  // Validate everything before touching any cache.
  std::vector<int64_t> row0(static_cast<size_t>(n_seq) + 1, 0);
  for (int64_t s = 0; s < n_seq; ++s) {
    const auto& q = batch[s];
    if (!q.cache) throw InvalidArgument("forward: sequence " + std::to_string(s) + " has no cache");
    for (TokenId t : q.tokens) {
      if (t < 0 || t >= V)
        throw InvalidArgument("forward: token id " + std::to_string(t) + " outside the vocabulary [0, " +
                              std::to_string(V) + ")");
    }
    if (q.cache->size() + static_cast<int64_t>(q.tokens.size()) > q.cache->max_tokens()) {
      throw InvalidArgument("context length exceeded: " +
                            std::to_string(q.cache->size() + q.tokens.size()) +
                            " tokens needed, the context holds " +
                            std::to_string(q.cache->max_tokens()));
    }
    row0[s + 1] = row0[s] + static_cast<int64_t>(q.tokens.size());
  }
  for (auto& q : batch) q.cache->reserve_more(static_cast<int64_t>(q.tokens.size()));
  const int64_t N = row0[n_seq];

  // Slots of the taps output filled by each layer (a layer may be listed twice).
  std::vector<std::vector<int64_t>> tap_slots(static_cast<size_t>(info_.n_layers));
  for (size_t i = 0; i < taps.layers.size(); ++i) {
    const int l = taps.layers[i];
    if (l < 0 || l >= info_.n_layers)
      throw InvalidArgument("forward: tap layer " + std::to_string(l) + " outside [0, " +
                            std::to_string(info_.n_layers) + ")");
    tap_slots[static_cast<size_t>(l)].push_back(static_cast<int64_t>(i));
  }
  const int64_t m = static_cast<int64_t>(taps.layers.size());

  std::vector<ForwardOut> out(static_cast<size_t>(n_seq));
  if (N == 0) return out;

  // Activations (fp32): x [N, d] residual; xn [N, max(d, H*hd, F)] matmul inputs; wide [N, max(Oqkv, 2F)].
  std::vector<float> x(static_cast<size_t>(N * d));
  std::vector<float> xn(static_cast<size_t>(N * std::max({d, H * hd, F})));
  std::vector<float> wide(static_cast<size_t>(N * std::max(Oqkv, 2 * F)));
  std::vector<float> tmp(static_cast<size_t>(N * d));
  std::vector<int64_t> pos(static_cast<size_t>(N));

  for (int64_t s = 0; s < n_seq; ++s) {
    for (int64_t t = 0; t < row0[s + 1] - row0[s]; ++t) {
      const int64_t r = row0[s] + t;
      pos[r] = batch[s].cache->size() + t;
      embd_.row_f32(batch[s].tokens[t], x.data() + r * d);
    }
  }
  std::vector<float*> tap_ptr(static_cast<size_t>(n_seq), nullptr);
  if (m > 0) {
    for (int64_t s = 0; s < n_seq; ++s) {
      out[s].taps = at::empty({row0[s + 1] - row0[s], m * d}, at::kFloat);
      tap_ptr[s] = out[s].taps.data_ptr<float>();
    }
  }

  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float eps = static_cast<float>(info_.rms_eps);
  for (int64_t l = 0; l < info_.n_layers; ++l) {
    const auto& L = layers_[static_cast<size_t>(l)];
    // Attention block.
    ops::rmsnorm_f32(x.data(), L.attn_norm.data_ptr<float>(), N, d, eps, xn.data());
    L.wqkv.forward(xn.data(), N, wide.data(), Oqkv);
    ops::rope_pairs(wide.data(), N, Oqkv, H, hd, rot_dim_, pos.data(), inv_freq_.data());
    ops::rope_pairs(wide.data() + H * hd, N, Oqkv, Hkv, hd, rot_dim_, pos.data(),
                        inv_freq_.data());
    for (int64_t s = 0; s < n_seq; ++s) {
      KVCache& c = *batch[s].cache;
      const int64_t T = row0[s + 1] - row0[s], cap = c.capacity(), past = c.size();
      float* K = c.keys(l);
      float* Vc = c.values(l);
      for (int64_t t = 0; t < T; ++t) {
        const float* r = wide.data() + (row0[s] + t) * Oqkv;
        for (int64_t g = 0; g < Hkv; ++g) {
          std::memcpy(K + (g * cap + past + t) * hd, r + (H + g) * hd, sizeof(float) * hd);
          std::memcpy(Vc + (g * cap + past + t) * hd, r + (H + Hkv + g) * hd, sizeof(float) * hd);
        }
      }
      ops::attention(wide.data() + row0[s] * Oqkv, Oqkv, K, Vc, cap, past, T, H, Hkv, hd, scale,
                         xn.data() + row0[s] * H * hd);
    }
    L.wo.forward(xn.data(), N, tmp.data(), d);
    ops::add_rows(x.data(), tmp.data(), N, d, d);
    // MLP block.
    ops::rmsnorm_f32(x.data(), L.ffn_norm.data_ptr<float>(), N, d, eps, xn.data());
    L.wgu.forward(xn.data(), N, wide.data(), 2 * F);
    ops::silu_mul(wide.data(), N, F, xn.data());
    L.wdown.forward(xn.data(), N, tmp.data(), d);
    ops::add_rows(x.data(), tmp.data(), N, d, d);

    for (const int64_t slot : tap_slots[static_cast<size_t>(l)]) {
      for (int64_t s = 0; s < n_seq; ++s)
        for (int64_t t = 0; t < row0[s + 1] - row0[s]; ++t)
          std::memcpy(tap_ptr[s] + t * m * d + slot * d, x.data() + (row0[s] + t) * d,
                      sizeof(float) * d);
    }
  }

  // Final norm, hidden taps and logits for the requested rows only; the LM
  // head runs once over the logit rows of every sequence.
  const float* wn = out_norm_.data_ptr<float>();
  std::vector<int64_t> lrow0(static_cast<size_t>(n_seq) + 1, 0);
  for (int64_t s = 0; s < n_seq; ++s) {
    const int64_t T = row0[s + 1] - row0[s];
    const float* xs = x.data() + row0[s] * d;
    if (taps.final_hidden) {
      out[s].final_hidden = at::empty({T, d}, at::kFloat);
      ops::rmsnorm_f32(xs, wn, T, d, eps, out[s].final_hidden.data_ptr<float>());
    }
    const int64_t n = batch[s].logits == Logits::All ? T
                      : batch[s].logits == Logits::Last ? std::min<int64_t>(1, T)
                                                        : 0;
    ops::rmsnorm_f32(xs + (T - n) * d, wn, n, d, eps, xn.data() + lrow0[s] * d);
    lrow0[s + 1] = lrow0[s] + n;
  }
  if (lrow0[n_seq] > 0) {
    at::Tensor logits = at::empty({lrow0[n_seq], V}, at::kFloat);
    head().forward(xn.data(), lrow0[n_seq], logits.data_ptr<float>(), V);
    for (int64_t s = 0; s < n_seq; ++s)
      if (lrow0[s + 1] > lrow0[s]) out[s].logits = logits.narrow(0, lrow0[s], lrow0[s + 1] - lrow0[s]);
  }
  for (int64_t s = 0; s < n_seq; ++s) batch[s].cache->advance(row0[s + 1] - row0[s]);
  return out;
}

}  // namespace

std::unique_ptr<TargetModel> make_llama(std::shared_ptr<const io::GGUFFile> file, ops::Compute compute) {
  return std::make_unique<LlamaModel>(std::move(file), compute);
}

}  // namespace dspark
