// A target's forward pass in ATen ops; see include/dspark/model/aten_forward.hpp.
#include "dspark/model/aten_forward.hpp"

#include <c10/core/GradMode.h>

#include <cmath>
#include <string>

#include "dspark/error.hpp"

namespace dspark {

namespace {

at::Tensor fp32_on(const at::Tensor& t, at::Device dev) {
  return t.defined() ? t.to(dev, at::kFloat).contiguous() : at::Tensor();
}

}  // namespace

AtenForward::AtenForward(const TargetModel& target, AtenForwardOptions opts) : info_(target.info()), opts_(opts) {
  if (opts_.weight_dtype != at::kBFloat16 && opts_.weight_dtype != at::kFloat)
    throw InvalidArgument(std::string("AtenForward: weights must be bf16 or fp32, got ") +
                          c10::toString(opts_.weight_dtype));
  const at::Device dev = opts_.device;
  const at::ScalarType wt = opts_.weight_dtype;
  auto matrix = [&](const ops::Linear& w) { return w.dequantized(wt).to(dev).contiguous(); };
  embd_ = target.embedding_table().dequantized(at::kFloat).to(dev);
  if (info_.embed_scale != 1.0) embd_.mul_(static_cast<float>(info_.embed_scale));
  head_ = matrix(target.head());
  out_norm_ = fp32_on(target.output_norm(), dev);
  for (int64_t l = 0; l < info_.n_layers; ++l) {
    const LayerRecipe r = target.layer_recipe(l);
    layers_.push_back({fp32_on(r.attn_norm, dev), fp32_on(r.q_norm, dev), fp32_on(r.k_norm, dev),
                       fp32_on(r.post_attn_norm, dev), fp32_on(r.ffn_norm, dev), fp32_on(r.post_ffn_norm, dev),
                       matrix(*r.wqkv), matrix(*r.wo), matrix(*r.wgu), matrix(*r.wdown),
                       at::tensor(r.inv_freq, at::kFloat).to(dev), r.gelu, r.rope_halves, r.rot_dim, r.window,
                       r.attn_scale});
  }
}

at::Tensor AtenForward::linear(const at::Tensor& x, const at::Tensor& w) const {
  return at::matmul(x.to(w.scalar_type()), w.t()).to(at::kFloat);
}

at::Tensor AtenForward::rmsnorm(const at::Tensor& x, const at::Tensor& w) const {
  return x * at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + info_.rms_eps) * w;
}

// x [T, heads, hd] fp32: the leading rot_dim dims of each head rotate by
// pos · inv_freq (angle in double, cos/sin rounded to fp32, like ops::rope_pairs).
at::Tensor AtenForward::rope(const at::Tensor& x, const Layer& L, const at::Tensor& pos) const {
  const int64_t rot = L.rot_dim, half = rot / 2, hd = x.size(2);
  const at::Tensor ang = pos.to(at::kDouble).unsqueeze(1) * L.inv_freq.to(at::kDouble).unsqueeze(0);  // [T, half]
  const at::Tensor c = ang.cos().to(at::kFloat).unsqueeze(1), s = ang.sin().to(at::kFloat).unsqueeze(1);
  const at::Tensor xr = x.narrow(2, 0, rot);
  at::Tensor out;
  if (L.rope_halves) {
    const at::Tensor a = xr.narrow(2, 0, half), b = xr.narrow(2, half, half);
    out = at::cat({a * c - b * s, a * s + b * c}, 2);
  } else {
    const at::Tensor v = xr.reshape({x.size(0), x.size(1), half, 2});
    const at::Tensor a = v.select(3, 0), b = v.select(3, 1);
    out = at::stack({a * c - b * s, a * s + b * c}, 3).reshape({x.size(0), x.size(1), rot});
  }
  return rot == hd ? out : at::cat({out, x.narrow(2, rot, hd - rot)}, 2);
}

void AtenForward::block(const Layer& L, at::Tensor& x, const at::Tensor& pos) const {
  const int64_t T = x.size(0), H = info_.n_heads, Hkv = info_.n_kv_heads, hd = info_.head_dim, F = info_.ffn;
  // Attention.
  const at::Tensor qkv = linear(rmsnorm(x, L.attn_norm), L.wqkv);  // [T, (H + 2 Hkv) hd]
  at::Tensor q = qkv.narrow(1, 0, H * hd).view({T, H, hd});
  at::Tensor k = qkv.narrow(1, H * hd, Hkv * hd).view({T, Hkv, hd});
  at::Tensor v = qkv.narrow(1, (H + Hkv) * hd, Hkv * hd).view({T, Hkv, hd});
  if (L.q_norm.defined()) q = rmsnorm(q, L.q_norm);
  if (L.k_norm.defined()) k = rmsnorm(k, L.k_norm);
  q = rope(q, L, pos).transpose(0, 1);                                       // [H, T, hd]
  k = rope(k, L, pos).transpose(0, 1).repeat_interleave(H / Hkv, 0);          // [H, T, hd]
  v = v.transpose(0, 1).repeat_interleave(H / Hkv, 0);                        // [H, T, hd]
  const at::Tensor i = pos.unsqueeze(1), j = pos.unsqueeze(0);
  at::Tensor hidden = j > i;  // [T, T] keys after the query
  if (L.window > 0) hidden = hidden.logical_or(i - j >= L.window);
  at::Tensor scores = at::matmul(q, k.transpose(1, 2)) * static_cast<double>(L.attn_scale);
  scores = scores.masked_fill(hidden, -INFINITY);
  at::Tensor o = linear(at::matmul(at::softmax(scores, -1), v).transpose(0, 1).reshape({T, H * hd}), L.wo);
  if (L.post_attn_norm.defined()) o = rmsnorm(o, L.post_attn_norm);
  x = x + o;
  // MLP.
  const at::Tensor gu = linear(rmsnorm(x, L.ffn_norm), L.wgu);  // [T, 2F]: gate, up
  const at::Tensor gate = gu.narrow(1, 0, F), up = gu.narrow(1, F, F);
  at::Tensor m = linear((L.gelu ? at::gelu(gate, "tanh") : at::silu(gate)) * up, L.wdown);
  if (L.post_ffn_norm.defined()) m = rmsnorm(m, L.post_ffn_norm);
  x = x + m;
}

at::Tensor AtenForward::head_logits(const at::Tensor& hidden) const {
  at::Tensor logits = linear(hidden, head_);
  if (info_.logit_softcap > 0) logits = at::tanh(logits / info_.logit_softcap) * info_.logit_softcap;
  return logits;
}

ForwardOut AtenForward::forward(std::span<const TokenId> tokens, Logits logits, const TapRequest& taps) const {
  const int64_t T = static_cast<int64_t>(tokens.size());
  if (T == 0) throw InvalidArgument("AtenForward: empty sequence");
  if (info_.context > 0 && T > info_.context)
    throw InvalidArgument("context length exceeded: " + std::to_string(T) + " tokens, the context holds " +
                          std::to_string(info_.context));
  for (TokenId t : tokens)
    if (t < 0 || t >= info_.vocab)
      throw InvalidArgument("AtenForward: token id " + std::to_string(t) + " outside the vocabulary [0, " +
                            std::to_string(info_.vocab) + ")");
  for (int l : taps.layers)
    if (l < 0 || l >= info_.n_layers)
      throw InvalidArgument("AtenForward: tap layer " + std::to_string(l) + " outside [0, " +
                            std::to_string(info_.n_layers) + ")");
  c10::NoGradGuard no_grad;
  const at::Device dev = opts_.device;
  const at::Tensor ids =
      at::tensor(std::vector<int64_t>(tokens.begin(), tokens.end()), at::kLong).to(dev);
  const at::Tensor pos = at::arange(T, at::TensorOptions().dtype(at::kLong).device(dev));
  at::Tensor x = embd_.index_select(0, ids);  // [T, d]
  std::vector<at::Tensor> tapped(taps.layers.size());
  for (int64_t l = 0; l < info_.n_layers; ++l) {
    block(layers_[static_cast<size_t>(l)], x, pos);
    for (size_t s = 0; s < taps.layers.size(); ++s)
      if (taps.layers[s] == l) tapped[s] = x;
  }
  ForwardOut out;
  if (!tapped.empty()) out.taps = at::cat(tapped, 1);
  if (taps.final_hidden || logits != Logits::None) {
    const at::Tensor h = rmsnorm(x, out_norm_);
    if (taps.final_hidden) out.final_hidden = h;
    if (logits == Logits::All) out.logits = head_logits(h);
    if (logits == Logits::Last) out.logits = head_logits(h.narrow(0, T - 1, 1));
  }
  return out;
}

}  // namespace dspark
