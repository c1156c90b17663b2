// DSpark drafter backbone: config, parameter registry, init, and the
// inference forward pass (see include/dspark/speculative/drafter.hpp).
//
// Inference runs on the same CPU kernels as the target, on plain fp32
// buffers (no tensor-library dispatch per operation): the drafter's own
// matrices in bf16, the target's embedding and LM head as the target computes
// them (quantized blocks or bf16), fp32 norms/RoPE/softmax. Per draft layer i:
//   H_ctx = hidden_norm(fc · concat(taps))                       [n, d]
//   K_ctx = rope(k_norm(W_k^i H_ctx)), V_ctx = W_v^i H_ctx        cached
//   x = embed([anchor, MASK × (γ-1)])                             [γ, d]
//   h = attn_norm(x); q,k,v = W_{q,k,v} h (q/k normed + RoPE at p..p+γ-1)
//   x += W_o · attn(q, [K_ctx; k], [V_ctx; v])   (no causal mask)
//   x += W_down (silu(W_gate h') ⊙ W_up h'), h' = ffn_norm(x)
// then h_k = output_norm(x)_k.
#include "dspark/speculative/drafter.hpp"

#include <ATen/Parallel.h>

#include <cmath>
#include <cstring>

#include "dspark/error.hpp"
#include "dspark/ops/head_norm.hpp"
#include "dspark/ops/kernels.hpp"
#include "dspark/ops/rope.hpp"

namespace dspark {

namespace {

std::vector<float> inv_freq(const DrafterConfig& c) { return ops::rope_inv_freq(c.rope_base, c.head_dim); }

std::string L(int i, const char* name) { return "layers." + std::to_string(i) + "." + name; }

}  // namespace

void DrafterConfig::complete_from(const TargetInfo& t) {
  if (n_heads == 0) n_heads = static_cast<int>(t.n_heads);
  if (n_kv_heads == 0) n_kv_heads = static_cast<int>(t.n_kv_heads);
  if (head_dim == 0) head_dim = static_cast<int>(t.head_dim);
  if (ffn == 0) ffn = static_cast<int>(t.ffn);
  if (hidden == 0) hidden = t.hidden;
  if (vocab == 0) vocab = t.vocab;
  if (target_id.empty()) target_id = t.id;
  rope_base = t.rope_base;
  eps = t.rms_eps;
  if (tap_layers.empty()) {
    // Five layers spread from layer 1 to L-3 (never the final layer).
    const int Lt = static_cast<int>(t.n_layers);
    const int m = std::min(5, std::max(1, Lt - 3));
    for (int i = 0; i < m; ++i) tap_layers.push_back(m == 1 ? 1 : 1 + i * (Lt - 4) / (m - 1));
  }
  for (int l : tap_layers)
    if (l < 0 || l >= t.n_layers)
      throw InvalidArgument("tap layer " + std::to_string(l) + " outside the target's layers [0, " +
                            std::to_string(t.n_layers) + ")");
  validate();
}

std::vector<std::pair<std::string, std::vector<int64_t>>> Drafter::param_spec(const DrafterConfig& c) {
  const int64_t d = c.hidden, hd = c.head_dim, H = c.n_heads, Hkv = c.n_kv_heads, F = c.ffn,
                r = c.markov_rank, V = c.vocab;
  std::vector<std::pair<std::string, std::vector<int64_t>>> s = {
      {"fc.weight", {d, c.m() * d}},
      {"hidden_norm.weight", {d}},
  };
  for (int i = 0; i < c.n_layers; ++i) {
    s.push_back({L(i, "attn_norm.weight"), {d}});
    s.push_back({L(i, "attn_q.weight"), {H * hd, d}});
    s.push_back({L(i, "attn_k.weight"), {Hkv * hd, d}});
    s.push_back({L(i, "attn_v.weight"), {Hkv * hd, d}});
    s.push_back({L(i, "attn_output.weight"), {d, H * hd}});
    s.push_back({L(i, "attn_q_norm.weight"), {hd}});
    s.push_back({L(i, "attn_k_norm.weight"), {hd}});
    s.push_back({L(i, "ffn_norm.weight"), {d}});
    s.push_back({L(i, "ffn_gate.weight"), {F, d}});
    s.push_back({L(i, "ffn_up.weight"), {F, d}});
    s.push_back({L(i, "ffn_down.weight"), {d, F}});
  }
  s.push_back({"output_norm.weight", {d}});
  if (c.mask_token_id < 0) s.push_back({"mask_embedding", {d}});
  // Markov embedding/projection and the confidence head are shared by every head type.
  s.push_back({"markov_w1.weight", {V, r}});
  s.push_back({"markov_w2.weight", {V, r}});
  s.push_back({"conf_proj.weight", {1, d + r}});
  s.push_back({"conf_proj.bias", {1}});
  // Head-specific parameters come last.
  switch (c.seq_head) {
    case SeqHead::Gated:
      s.push_back({"markov_gate.weight", {r, d + r}});
      s.push_back({"markov_gate.bias", {r}});
      break;
    case SeqHead::Rnn:
      s.push_back({"rnn.weight", {3 * r, 2 * r + d}});
      s.push_back({"rnn.bias", {3 * r}});
      break;
    case SeqHead::Elman:
      s.push_back({"elman.wh", {r, r}});
      s.push_back({"elman.bh", {r}});
      s.push_back({"elman.wo", {V, r}});
      break;
    default: break;
  }
  return s;
}

Drafter Drafter::init(const DrafterConfig& cfg, uint64_t seed) {
  cfg.validate();
  at::Generator gen = at::detail::createCPUGenerator(seed);
  std::map<std::string, at::Tensor> p;
  for (const auto& [name, shape] : param_spec(cfg)) {
    at::Tensor t;
    const bool norm = name.find("norm") != std::string::npos;
    const bool zero = name == "markov_w2.weight" || name == "elman.wo" || name == "conf_proj.bias" ||
                      name == "markov_gate.bias" || name == "rnn.bias" || name == "elman.bh";
    if (norm) {
      t = at::ones(shape, at::kFloat);
    } else if (zero) {
      t = at::zeros(shape, at::kFloat);
    } else {
      t = at::empty(shape, at::kFloat).normal_(0.0, 0.02, gen);
    }
    p.emplace(name, t);
  }
  return Drafter(cfg, std::move(p));
}

Drafter::Drafter(DrafterConfig cfg, std::map<std::string, at::Tensor> params)
    : cfg_(std::move(cfg)), params_(std::move(params)) {
  cfg_.validate();
  for (const auto& [name, shape] : param_spec(cfg_)) {
    auto it = params_.find(name);
    if (it == params_.end()) throw FormatError("drafter: missing parameter '" + name + "'");
    if (it->second.sizes().vec() != shape) {
      throw FormatError("drafter: parameter '" + name + "' has shape " +
                        c10::str(it->second.sizes()) + ", expected " + c10::str(at::IntArrayRef(shape)));
    }
    it->second = it->second.to(at::kFloat).contiguous();
  }
  if (params_.size() != param_spec(cfg_).size()) {
    for (const auto& [name, t] : params_) {
      bool known = false;
      for (const auto& [n2, s2] : param_spec(cfg_)) known |= n2 == name;
      if (!known) throw FormatError("drafter: unexpected parameter '" + name + "' for seq_head " +
                                    to_string(cfg_.seq_head));
    }
  }
}

void Drafter::bind(const TargetModel& target, bool quantize) {
  // Matrices whose rows are whole Q8_0 blocks go to the int8 kernels when asked.
  auto make_linear = [quantize](const at::Tensor& w) {
    return quantize && w.size(1) % 32 == 0 ? ops::Linear::from_tensor_q8_0(w) : ops::Linear::from_tensor(w);
  };
  const auto& t = target.info();
  if (t.hidden != cfg_.hidden || t.vocab != cfg_.vocab) {
    throw InvalidArgument("drafter dims (hidden " + std::to_string(cfg_.hidden) + ", vocab " +
                          std::to_string(cfg_.vocab) + ") do not match the target (hidden " +
                          std::to_string(t.hidden) + ", vocab " + std::to_string(t.vocab) + ")");
  }
  target_ = &target;
  vocab_ids_ = cfg_.draft_vocab;
  const std::vector<int64_t> rows(vocab_ids_.begin(), vocab_ids_.end());
  head_ = rows.empty() ? target.head() : target.head().gather_rows(rows);
  at::Tensor row_index;  // draft-vocab rows of every [V, *] output matrix
  if (!rows.empty()) row_index = at::tensor(rows, at::kLong);
  infer_.clear();
  lin_.clear();
  for (const auto& [name, p] : params_) {
    if (p.dim() != 2 || name == "conf_proj.weight") {
      infer_[name] = p.contiguous();
    } else if (name == "markov_w1.weight") {
      infer_[name] = p.to(at::kBFloat16).contiguous();  // rows looked up by token
    } else {
      const bool output_rows = name == "markov_w2.weight" || name == "elman.wo";
      if (output_rows) {
        // [V', r] -> fp32 [C, r, kRankChunk]: rank-r output products as r row
        // passes (ops::weighted_rows) over column chunks that stay in L1.
        const at::Tensor wt = (row_index.defined() ? p.index_select(0, row_index) : p).to(at::kFloat).t();
        const int64_t r = wt.size(0), V = wt.size(1), C = (V + kRankChunk - 1) / kRankChunk;
        infer_[name + ".t"] = at::constant_pad_nd(wt, {0, C * kRankChunk - V}).view({r, C, kRankChunk}).permute({1, 0, 2}).contiguous();
      } else {
        lin_[name] = make_linear(p);
      }
    }
  }
  // Fused products: one pass over the block for q|k|v and gate|up, one over the context for k|v.
  for (int i = 0; i < cfg_.n_layers; ++i) {
    lin_[L(i, "attn_qkv")] = make_linear(
        at::cat({params_.at(L(i, "attn_q.weight")), params_.at(L(i, "attn_k.weight")), params_.at(L(i, "attn_v.weight"))}));
    lin_[L(i, "attn_kv")] =
        make_linear(at::cat({params_.at(L(i, "attn_k.weight")), params_.at(L(i, "attn_v.weight"))}));
    lin_[L(i, "ffn_gate_up")] =
        make_linear(at::cat({params_.at(L(i, "ffn_gate.weight")), params_.at(L(i, "ffn_up.weight"))}));
  }
  bound_ = true;
}

const at::Tensor& Drafter::w(const std::string& name) const { return infer_.at(name); }
const ops::Linear& Drafter::lin(const std::string& name) const { return lin_.at(name); }

namespace {

// Per-head RMSNorm of rows [T, n_heads, hd] (row stride `stride` floats) in place.
void head_norm(float* x, int64_t T, int64_t stride, int64_t n_heads, int64_t hd, const at::Tensor& w, double eps) {
  ops::head_rmsnorm(x, T, stride, n_heads, hd, w.data_ptr<float>(), static_cast<float>(eps));
}

// rows [T, Hkv*hd] at `src` (row stride `stride`) -> cache [Hkv, cap, hd] at positions p0..p0+T-1.
void to_cache(const float* src, int64_t T, int64_t stride, const at::Tensor& cache, int64_t p0, int64_t Hkv,
              int64_t hd) {
  float* c = cache.data_ptr<float>();
  const int64_t cap = cache.size(1);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t g = 0; g < Hkv; ++g)
      std::memcpy(c + (g * cap + p0 + t) * hd, src + t * stride + g * hd, sizeof(float) * hd);
}

}  // namespace

void Drafter::append_context(DraftState& st, const at::Tensor& feats) const {
  if (!bound_) throw InvalidArgument("drafter: bind() must be called before use");
  const int64_t n = feats.size(0), d = cfg_.hidden, hd = cfg_.head_dim, Hkv = cfg_.n_kv_heads;
  if (feats.dim() != 2 || feats.size(1) != cfg_.m() * d) {
    throw InvalidArgument("drafter: context features have shape " + c10::str(feats.sizes()) +
                          ", expected [n, " + std::to_string(cfg_.m() * d) + "]");
  }
  if (n == 0) return;
  // Grow the per-layer caches (room for the block's γ rows too).
  const int64_t need = st.n_ctx + n + kMaxGamma;
  if (st.k.empty() || st.k[0].size(1) < need) {
    const int64_t cap = std::max<int64_t>(need, st.k.empty() ? 256 : st.k[0].size(1) * 2);
    for (int i = 0; i < cfg_.n_layers; ++i) {
      at::Tensor k = at::zeros({Hkv, cap, hd}, at::kFloat), v = at::zeros({Hkv, cap, hd}, at::kFloat);
      if (!st.k.empty() && st.n_ctx > 0) {
        k.narrow(1, 0, st.n_ctx).copy_(st.k[i].narrow(1, 0, st.n_ctx));
        v.narrow(1, 0, st.n_ctx).copy_(st.v[i].narrow(1, 0, st.n_ctx));
      }
      if (st.k.size() <= static_cast<size_t>(i)) {
        st.k.push_back(k);
        st.v.push_back(v);
      } else {
        st.k[i] = k;
        st.v[i] = v;
      }
    }
  }
  // H_ctx = hidden_norm(fc · feats)
  const at::Tensor f = feats.to(at::kFloat).contiguous();
  std::vector<float> h(static_cast<size_t>(n * d)), kv(static_cast<size_t>(n * 2 * Hkv * hd));
  lin("fc.weight").forward(f.data_ptr<float>(), n, h.data(), d);
  ops::rmsnorm_f32(h.data(), w("hidden_norm.weight").data_ptr<float>(), n, d, static_cast<float>(cfg_.eps), h.data());
  const auto freq = inv_freq(cfg_);
  std::vector<int64_t> pos(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) pos[i] = st.n_ctx + i;
  const int64_t Okv = 2 * Hkv * hd;
  for (int i = 0; i < cfg_.n_layers; ++i) {
    lin(L(i, "attn_kv")).forward(h.data(), n, kv.data(), Okv);  // [n, k | v]
    head_norm(kv.data(), n, Okv, Hkv, hd, w(L(i, "attn_k_norm.weight")), cfg_.eps);
    ops::rope_pairs(kv.data(), n, Okv, Hkv, hd, hd, pos.data(), freq.data());
    to_cache(kv.data(), n, Okv, st.k[i], st.n_ctx, Hkv, hd);
    to_cache(kv.data() + Hkv * hd, n, Okv, st.v[i], st.n_ctx, Hkv, hd);
  }
  st.n_ctx += n;
}

at::Tensor Drafter::block_hidden(const DraftState& st, TokenId anchor, int gamma) const {
  if (!bound_) throw InvalidArgument("drafter: bind() must be called before use");
  if (st.k.empty()) throw InvalidArgument("drafter: no context features appended yet");
  if (gamma < 1 || gamma > kMaxGamma)
    throw InvalidArgument("drafter: gamma must be in [1, " + std::to_string(kMaxGamma) + "], got " +
                          std::to_string(gamma));
  const int64_t G = gamma, d = cfg_.hidden, hd = cfg_.head_dim, H = cfg_.n_heads,
                Hkv = cfg_.n_kv_heads, F = cfg_.ffn, p = st.n_ctx;
  const int64_t Oqkv = (H + 2 * Hkv) * hd;
  const float eps = static_cast<float>(cfg_.eps);
  // Buffers: x [γ, d] residual; xn [γ, max(d, H*hd, F)] matmul inputs; wide [γ, max(Oqkv, 2F)].
  std::vector<float> x(static_cast<size_t>(G * d)), tmp(x.size());
  std::vector<float> xn(static_cast<size_t>(G * std::max({d, H * hd, F})));
  std::vector<float> wide(static_cast<size_t>(G * std::max(Oqkv, 2 * F)));
  // x = embed([anchor, MASK × (γ-1)]), as the target embeds tokens (its scale included)
  target_->embed(std::span<const TokenId>(&anchor, 1), x.data());
  if (G > 1) {
    const TokenId mask = cfg_.mask_token_id;
    if (mask >= 0) target_->embed(std::span<const TokenId>(&mask, 1), x.data() + d);
    else std::memcpy(x.data() + d, w("mask_embedding").data_ptr<float>(), sizeof(float) * d);
    for (int64_t k = 2; k < G; ++k) std::memcpy(x.data() + k * d, x.data() + d, sizeof(float) * d);
  }
  const auto freq = inv_freq(cfg_);
  std::vector<int64_t> pos(static_cast<size_t>(G));
  for (int64_t i = 0; i < G; ++i) pos[i] = p + i;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int i = 0; i < cfg_.n_layers; ++i) {
    ops::rmsnorm_f32(x.data(), w(L(i, "attn_norm.weight")).data_ptr<float>(), G, d, eps, xn.data());
    lin(L(i, "attn_qkv")).forward(xn.data(), G, wide.data(), Oqkv);  // [γ, q | k | v]
    head_norm(wide.data(), G, Oqkv, H, hd, w(L(i, "attn_q_norm.weight")), cfg_.eps);
    head_norm(wide.data() + H * hd, G, Oqkv, Hkv, hd, w(L(i, "attn_k_norm.weight")), cfg_.eps);
    ops::rope_pairs(wide.data(), G, Oqkv, H, hd, hd, pos.data(), freq.data());
    ops::rope_pairs(wide.data() + H * hd, G, Oqkv, Hkv, hd, hd, pos.data(), freq.data());
    // Block keys/values go into the scratch rows right after the context.
    to_cache(wide.data() + H * hd, G, Oqkv, st.k[i], p, Hkv, hd);
    to_cache(wide.data() + (H + Hkv) * hd, G, Oqkv, st.v[i], p, Hkv, hd);
    ops::attention(wide.data(), Oqkv, st.k[i].data_ptr<float>(), st.v[i].data_ptr<float>(), st.k[i].size(1), p, G,
                   H, Hkv, hd, scale, xn.data(), /*causal=*/false);
    lin(L(i, "attn_output.weight")).forward(xn.data(), G, tmp.data(), d);
    ops::add_rows(x.data(), tmp.data(), G, d, d);
    ops::rmsnorm_f32(x.data(), w(L(i, "ffn_norm.weight")).data_ptr<float>(), G, d, eps, xn.data());
    lin(L(i, "ffn_gate_up")).forward(xn.data(), G, wide.data(), 2 * F);
    ops::silu_mul(wide.data(), G, F, xn.data());
    lin(L(i, "ffn_down.weight")).forward(xn.data(), G, tmp.data(), d);
    ops::add_rows(x.data(), tmp.data(), G, d, d);
  }
  at::Tensor out = at::empty({G, d}, at::kFloat);
  ops::rmsnorm_f32(x.data(), w("output_norm.weight").data_ptr<float>(), G, d, eps, out.data_ptr<float>());
  return out;
}

}  // namespace dspark
