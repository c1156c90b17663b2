// Differentiable batched drafter forward; see include/dspark/train/drafter_graph.hpp.
#include "dspark/train/drafter_graph.hpp"

#include <torch/csrc/autograd/custom_function.h>

#include <cmath>

#include "bf16_matmul.hpp"
#include "dspark/error.hpp"
#include "dspark/ops/kernels.hpp"

namespace dspark::train {

namespace {

std::string L(int i, const char* name) { return "layers." + std::to_string(i) + "." + name; }

// RMSNorm over the last dim: x / sqrt(mean(x²) + eps) * w.
at::Tensor rmsnorm(const at::Tensor& x, const at::Tensor& w, double eps) {
  return x * at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps) * w;
}

// cos/sin tables [..., hd/2] for positions pos [...] (int64), computed in
// double like ops::rope_pairs (angle = pos · inv_freq_f32[i]).
std::pair<at::Tensor, at::Tensor> rope_tables(const at::Tensor& pos, const DrafterConfig& c,
                                              at::ScalarType dtype) {
  const int64_t half = c.head_dim / 2;
  at::Tensor f = at::empty({half}, at::kDouble);
  double* fp = f.data_ptr<double>();
  for (int64_t i = 0; i < half; ++i)
    fp[i] = static_cast<double>(static_cast<float>(
        std::pow(c.rope_base, -2.0 * static_cast<double>(i) / static_cast<double>(c.head_dim))));
  at::Tensor ang = pos.to(at::kDouble).unsqueeze(-1) * f.to(pos.device());  // [..., half]
  return {ang.cos().to(dtype), ang.sin().to(dtype)};
}

// Rotates pairs (2i, 2i+1) of x [..., T, heads, hd] by cos/sin [..., T, hd/2].
at::Tensor rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  auto sizes = x.sizes().vec();
  sizes.back() /= 2;
  sizes.push_back(2);
  at::Tensor xv = x.reshape(sizes);
  at::Tensor a = xv.select(-1, 0), b = xv.select(-1, 1);
  at::Tensor c = cos.unsqueeze(-2), s = sin.unsqueeze(-2);  // broadcast over heads
  return at::stack({a * c - b * s, a * s + b * c}, -1).flatten(-2);
}

const uint16_t* bf16_bits(const at::Tensor& t) {
  return reinterpret_cast<const uint16_t*>(t.data_ptr<at::BFloat16>());
}

// a · b in bf16 precision: bf16 inputs, fp32 accumulation, a bf16 result (as
// a GPU's bf16 matmul), returned as fp32 (src/train/bf16_matmul.hpp: oneDNN's
// bf16 products where the CPU has them, else fp32 products of the
// bf16-rounded inputs).
at::Tensor bf16_matmul(const at::Tensor& a, const at::Tensor& b) {
  return detail::matmul_bf16(a, b).to(at::kFloat);
}

// y [M, O] fp32 = bf16(x) [M, K] · Wᵀ, W [O, K] bf16 contiguous, K % 32 == 0,
// on the inference kernel (fp32 accumulation and output).
at::Tensor kernel_linear(const at::Tensor& x, const at::Tensor& W) {
  at::Tensor xb = x.to(at::kBFloat16).contiguous();
  at::Tensor y = at::empty({x.size(0), W.size(0)}, at::kFloat);
  ops::linear_bf16(bf16_bits(xb), x.size(0), bf16_bits(W), W.size(0), W.size(1), y.data_ptr<float>(),
                       W.size(0));
  return y;
}

// The frozen LM head on the inference kernel: y = bf16(h) · headᵀ in fp32.
// Backward (h only): grad_h = bf16(grad_y) · head, through headT [d, Vp]
// (the head transposed, zero-padded to a multiple of 32 columns).
class FrozenHeadFn : public torch::autograd::Function<FrozenHeadFn> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& h,
                                                const at::Tensor& head, const at::Tensor& headT) {
    ctx->save_for_backward({headT});
    ctx->saved_data["V"] = head.size(0);
    return {kernel_linear(h, head)};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor headT = ctx->get_saved_variables()[0];
    const int64_t V = ctx->saved_data["V"].toInt(), Vp = headT.size(1);
    const at::Tensor& g = grads[0];
    at::Tensor gb = at::zeros({g.size(0), Vp}, at::kBFloat16);
    gb.narrow(1, 0, V).copy_(g);
    at::Tensor gh = at::empty({g.size(0), headT.size(0)}, at::kFloat);
    ops::linear_bf16(bf16_bits(gb), g.size(0), bf16_bits(headT), headT.size(0), Vp, gh.data_ptr<float>(),
                         headT.size(0));
    return {gh, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

DrafterGraph::DrafterGraph(DrafterConfig cfg, at::Tensor embedding, at::Tensor lm_head, GraphOptions opts)
    : cfg_(std::move(cfg)), embed_(std::move(embedding)), head_(std::move(lm_head)), opts_(opts) {
  cfg_.validate();
  for (const at::Tensor* t : {&embed_, &head_}) {
    if (!t->defined() || t->dim() != 2 || t->size(0) != cfg_.vocab || t->size(1) != cfg_.hidden)
      throw InvalidArgument("drafter graph: embedding/LM head must be [" + std::to_string(cfg_.vocab) +
                            ", " + std::to_string(cfg_.hidden) + "], got " +
                            (t->defined() ? c10::str(t->sizes()) : std::string("undefined")));
  }
  if (!cfg_.draft_vocab.empty()) {
    rows_ = at::tensor(std::vector<int64_t>(cfg_.draft_vocab.begin(), cfg_.draft_vocab.end()), at::kLong)
                .to(head_.device());
    head_ = head_.detach().index_select(0, rows_).contiguous();
  }
}

const at::Tensor& DrafterGraph::frozen(const at::Tensor& src, at::ScalarType dtype, int which) const {
  auto& cache = frozen_cache_[which];
  auto it = cache.find(dtype);
  if (it == cache.end()) {
    it = cache.emplace(dtype, src.detach().to(dtype).contiguous()).first;
  }
  return it->second;
}

at::Tensor DrafterGraph::linear(const at::Tensor& x, const at::Tensor& W) const {
  if (x.scalar_type() == at::kFloat && opts_.matmul == MatmulPrecision::BFloat16) {
    return bf16_matmul(x, W.t());
  }
  return at::matmul(x, W.t());
}

at::Tensor DrafterGraph::bmm(const at::Tensor& a, const at::Tensor& b) const {
  if (a.scalar_type() == at::kFloat && opts_.matmul == MatmulPrecision::BFloat16) {
    return bf16_matmul(a, b);
  }
  return at::matmul(a, b);
}

at::Tensor DrafterGraph::lm_head(const at::Tensor& h) const {
  if (h.scalar_type() == at::kFloat && opts_.matmul == MatmulPrecision::BFloat16) {
    const at::Tensor& hb = frozen(head_, at::kBFloat16, 1);
    // The inference kernel where ATen's bf16 product would be an fp32 one.
    if (!(opts_.kernels && h.is_cpu()) || detail::native_bf16_matmul(h, hb.t())) return bf16_matmul(h, hb.t());
    if (!headT_.defined()) {
      const int64_t V = head_.size(0), Vp = (V + 31) / 32 * 32;
      headT_ = at::zeros({cfg_.hidden, Vp}, at::kBFloat16);
      headT_.narrow(1, 0, V).copy_(head_.detach().t());
    }
    auto sizes = h.sizes().vec();
    sizes.back() = head_.size(0);
    return FrozenHeadFn::apply(h.reshape({-1, cfg_.hidden}), hb, headT_)[0].view(sizes);
  }
  return at::matmul(h, frozen(head_, h.scalar_type(), 1).t());
}

GraphOut DrafterGraph::forward(const ParamMap& params, const at::Tensor& ctx_feats,
                               const at::Tensor& anchors, const at::Tensor& prev_tokens) const {
  const DrafterConfig& c = cfg_;
  auto P = [&](const std::string& name) -> const at::Tensor& {
    auto it = params.find(name);
    if (it == params.end()) throw InvalidArgument("drafter graph: missing parameter '" + name + "'");
    return it->second;
  };
  const at::ScalarType dt = P("fc.weight").scalar_type();
  if (dt != at::kFloat && dt != at::kDouble)
    throw InvalidArgument("drafter graph: parameters must be fp32 or fp64");
  for (const auto& [name, shape] : Drafter::param_spec(c)) {
    const at::Tensor& t = P(name);
    if (t.scalar_type() != dt || t.sizes().vec() != shape)
      throw InvalidArgument("drafter graph: parameter '" + name + "' has shape " + c10::str(t.sizes()) +
                            " and dtype " + std::string(c10::toString(t.scalar_type())) +
                            ", expected " + c10::str(at::IntArrayRef(shape)) + " " +
                            std::string(c10::toString(dt)));
  }
  const int64_t d = c.hidden, hd = c.head_dim, H = c.n_heads, Hkv = c.n_kv_heads, V = c.vocab,
                r = c.markov_rank, group = H / Hkv;
  if (ctx_feats.dim() != 2 || ctx_feats.size(1) != c.m() * d)
    throw InvalidArgument("drafter graph: context features have shape " + c10::str(ctx_feats.sizes()) +
                          ", expected [L, " + std::to_string(c.m() * d) + "]");
  if (anchors.dim() != 1 || anchors.scalar_type() != at::kLong)
    throw InvalidArgument("drafter graph: anchors must be a 1-D int64 tensor");
  const int64_t N = anchors.size(0);
  if (prev_tokens.dim() != 2 || prev_tokens.scalar_type() != at::kLong || prev_tokens.size(0) != N ||
      prev_tokens.size(1) < 1 || prev_tokens.size(1) > kMaxGamma)
    throw InvalidArgument("drafter graph: prev_tokens must be int64 [N, γ] with N = " + std::to_string(N) +
                          " and 1 <= γ <= " + std::to_string(kMaxGamma) + ", got " +
                          c10::str(prev_tokens.sizes()));
  const int64_t G = prev_tokens.size(1);
  if (N == 0) throw InvalidArgument("drafter graph: no anchors");
  const int64_t p_max = anchors.max().item<int64_t>();
  if (anchors.min().item<int64_t>() < 0 || p_max > ctx_feats.size(0))
    throw InvalidArgument("drafter graph: anchor positions must lie in [0, " +
                          std::to_string(ctx_feats.size(0)) + "]");
  if (prev_tokens.min().item<int64_t>() < 0 || prev_tokens.max().item<int64_t>() >= V)
    throw InvalidArgument("drafter graph: token id outside the vocabulary [0, " + std::to_string(V) + ")");

  // Only rows below the largest anchor are ever visible.
  const int64_t Lc = p_max;
  at::Tensor feats = ctx_feats.narrow(0, 0, Lc).to(dt);
  at::Tensor hctx = rmsnorm(linear(feats, P("fc.weight")), P("hidden_norm.weight"), c.eps);  // [Lc, d]

  // Block input [N, γ, d]: anchor embedding then MASK.
  const at::Tensor& E = frozen(embed_, dt, 0);
  at::Tensor x = E.index_select(0, prev_tokens.select(1, 0)).unsqueeze(1);  // [N, 1, d]
  if (G > 1) {
    at::Tensor mask = c.mask_token_id >= 0 ? E[c.mask_token_id] : P("mask_embedding");
    x = at::cat({x, mask.view({1, 1, d}).expand({N, G - 1, d})}, 1);
  }

  // RoPE tables: block positions p_i + j, context positions 0..Lc-1.
  const at::TensorOptions ids = anchors.options();
  at::Tensor pos_blk = anchors.unsqueeze(1) + at::arange(G, ids).unsqueeze(0);  // [N, γ]
  auto [cos_b, sin_b] = rope_tables(pos_blk, c, dt);                                   // [N, γ, hd/2]
  auto [cos_c, sin_c] = rope_tables(at::arange(Lc, ids), c, dt);                       // [Lc, hd/2]
  // Additive mask over context keys: -inf where l >= p_i.  [1, N, 1, Lc]
  at::Tensor ctx_mask = at::zeros({N, Lc}, feats.options()).masked_fill(
      at::arange(Lc, ids).unsqueeze(0) >= anchors.unsqueeze(1), -INFINITY);
  ctx_mask = ctx_mask.view({1, N, 1, Lc});
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));

  for (int i = 0; i < c.n_layers; ++i) {
    const at::Tensor& Wk = P(L(i, "attn_k.weight"));
    const at::Tensor& Wv = P(L(i, "attn_v.weight"));
    const at::Tensor& qn = P(L(i, "attn_q_norm.weight"));
    const at::Tensor& kn = P(L(i, "attn_k_norm.weight"));
    at::Tensor h = rmsnorm(x, P(L(i, "attn_norm.weight")), c.eps);
    at::Tensor q = rope(rmsnorm(linear(h, P(L(i, "attn_q.weight"))).view({N, G, H, hd}), qn, c.eps),
                        cos_b, sin_b);
    at::Tensor kb = rope(rmsnorm(linear(h, Wk).view({N, G, Hkv, hd}), kn, c.eps), cos_b, sin_b);
    at::Tensor vb = linear(h, Wv).view({N, G, Hkv, hd});
    at::Tensor kc = rope(rmsnorm(linear(hctx, Wk).view({Lc, Hkv, hd}), kn, c.eps), cos_c, sin_c);
    at::Tensor vc = linear(hctx, Wv).view({Lc, Hkv, hd});

    // Query head h = g * group + j reads KV head g. Layout [Hkv, N, group·γ, hd]
    // so that all anchors share one product with the context keys per KV head.
    const int64_t gG = group * G;
    at::Tensor qg = q.view({N, G, Hkv, group, hd}).permute({2, 0, 3, 1, 4}).reshape({Hkv, N, gG, hd});
    at::Tensor s_ctx = bmm(qg.reshape({Hkv, N * gG, hd}), kc.permute({1, 2, 0}))  // [Hkv, N·gγ, Lc]
                           .view({Hkv, N, gG, Lc}) + ctx_mask;
    at::Tensor s_blk = bmm(qg, kb.permute({2, 0, 3, 1}));                      // [Hkv, N, gγ, γ]
    at::Tensor prob = at::softmax(at::cat({s_ctx, s_blk}, -1) * scale, -1);   // [Hkv, N, gγ, Lc+γ]
    at::Tensor o = bmm(prob.narrow(-1, Lc, G), vb.permute({2, 0, 1, 3}));      // [Hkv, N, gγ, hd]
    if (Lc > 0)
      o = o + bmm(prob.narrow(-1, 0, Lc).reshape({Hkv, N * gG, Lc}), vc.permute({1, 0, 2})).view({Hkv, N, gG, hd});
    o = o.view({Hkv, N, group, G, hd}).permute({1, 3, 0, 2, 4}).reshape({N, G, H * hd});
    x = x + linear(o, P(L(i, "attn_output.weight")));

    at::Tensor hf = rmsnorm(x, P(L(i, "ffn_norm.weight")), c.eps);
    at::Tensor act = at::silu(linear(hf, P(L(i, "ffn_gate.weight")))) * linear(hf, P(L(i, "ffn_up.weight")));
    x = x + linear(act, P(L(i, "ffn_down.weight")));
  }
  GraphOut out;
  out.hidden = rmsnorm(x, P("output_norm.weight"), c.eps);  // [N, γ, d]
  at::Tensor U = lm_head(out.hidden);                        // [N, γ, V']
  // Output rows of the sequential head: the draft vocabulary's (a
  // differentiable gather) or all of them.
  auto out_rows = [&](const std::string& name) {
    const at::Tensor& W = P(name);
    return rows_.defined() ? W.index_select(0, rows_) : W;
  };

  // Sequential head under teacher forcing: e_k = W1[x_{k-1}].
  at::Tensor e = at::embedding(P("markov_w1.weight"), prev_tokens);  // [N, γ, r]
  at::Tensor he = at::cat({out.hidden, e}, -1);                      // [N, γ, d + r]
  switch (c.seq_head) {
    case SeqHead::None:
      out.logits = U;
      break;
    case SeqHead::Markov:  // Eq. 5
      out.logits = U + linear(e, out_rows("markov_w2.weight"));
      break;
    case SeqHead::Gated: {
      at::Tensor g = at::sigmoid(at::matmul(he, P("markov_gate.weight").t()) + P("markov_gate.bias"));
      out.logits = U + linear(g * e, out_rows("markov_w2.weight"));
      break;
    }
    case SeqHead::Rnn: {  // Eq. 6, unrolled over the block
      const at::Tensor& W = P("rnn.weight");
      const at::Tensor& b = P("rnn.bias");
      at::Tensor s = at::zeros({N, r}, e.options());
      std::vector<at::Tensor> os;
      for (int64_t k = 0; k < G; ++k) {
        at::Tensor zin = at::cat({s, e.select(1, k), out.hidden.select(1, k)}, -1);  // [N, 2r + d]
        at::Tensor gco = at::matmul(zin, W.t()) + b;                                 // [N, 3r]
        at::Tensor g = at::sigmoid(gco.narrow(1, 0, r));
        s = g * s + (1 - g) * at::tanh(gco.narrow(1, r, r));
        os.push_back(at::tanh(gco.narrow(1, 2 * r, r)));
      }
      out.logits = U + linear(at::stack(os, 1), out_rows("markov_w2.weight"));
      break;
    }
    case SeqHead::Elman: {
      const at::Tensor& Wh = P("elman.wh");
      const at::Tensor& bh = P("elman.bh");
      at::Tensor s = at::zeros({N, r}, e.options());
      std::vector<at::Tensor> ss;
      for (int64_t k = 0; k < G; ++k) {
        s = at::tanh(at::matmul(s, Wh.t()) + e.select(1, k) + bh);
        ss.push_back(s);
      }
      out.logits = U + linear(at::stack(ss, 1), out_rows("elman.wo"));
      break;
    }
  }
  // Confidence head (Eq. 7), kept at full precision like the inference path.
  out.conf_logits = (at::matmul(he, P("conf_proj.weight").t()) + P("conf_proj.bias")).squeeze(-1);
  return out;
}

}  // namespace dspark::train
