// Shared decoder forward pass; see decoder.hpp.
#include "decoder.hpp"

#include <algorithm>
#include <cstring>

#include "dspark/error.hpp"
#include "dspark/ops/attention_window.hpp"
#include "dspark/ops/kernels.hpp"

namespace dspark {

thread_local DecoderModel::Scratch DecoderModel::buf_;

Weights DecoderModel::load_weights(const DecoderConfig& config, std::vector<TensorSpec> family,
                                   ops::Compute compute) {
  info_ = config.info;
  info_.compute = ops::to_string(compute);
  rot_dim_ = config.rot_dim;
  const int64_t V = info_.vocab, d = info_.hidden;
  std::vector<TensorSpec> specs = {
      {"token_embd.weight", {V, d}}, {"output_norm.weight", {d}}, {"output.weight", {V, d}, false}};
  for (auto& s : family) specs.push_back(std::move(s));
  Weights w(*file_, std::move(specs), compute);
  embd_ = w.linear({"token_embd.weight"});
  tied_ = !w.has("output.weight");
  if (!tied_) head_ = w.linear({"output.weight"});
  out_norm_ = w.vector("output_norm.weight");
  return w;
}

DecoderModel::BlockWeights DecoderModel::load_block(const Weights& w, int64_t l, bool qk_norm) {
  const std::string p = "blk." + std::to_string(l) + ".";
  BlockWeights b;
  b.attn_norm = w.vector(p + "attn_norm.weight");
  if (qk_norm) {
    b.q_norm = w.vector(p + "attn_q_norm.weight");
    b.k_norm = w.vector(p + "attn_k_norm.weight");
  }
  b.wqkv = w.linear({p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"});
  b.wo = w.linear({p + "attn_output.weight"});
  b.ffn_norm = w.vector(p + "ffn_norm.weight");
  b.wgu = w.linear({p + "ffn_gate.weight", p + "ffn_up.weight"});
  b.wdown = w.linear({p + "ffn_down.weight"});
  return b;
}

int64_t DecoderModel::check_layer(int64_t l) const {
  if (l < 0 || l >= info_.n_layers)
    throw InvalidArgument("layer_recipe: layer " + std::to_string(l) + " outside [0, " +
                          std::to_string(info_.n_layers) + ")");
  return l;
}

LayerRecipe DecoderModel::block_recipe(int64_t l, const BlockWeights& b, bool rope_halves,
                                       const std::vector<float>& inv_freq, float attn_scale) const {
  LayerRecipe r;
  r.attn_norm = b.attn_norm;
  r.q_norm = b.q_norm;
  r.k_norm = b.k_norm;
  r.wqkv = &b.wqkv;
  r.wo = &b.wo;
  r.ffn_norm = b.ffn_norm;
  r.wgu = &b.wgu;
  r.wdown = &b.wdown;
  r.rope_halves = rope_halves;
  r.rot_dim = rot_dim_;
  r.inv_freq = inv_freq;
  r.attn_scale = attn_scale;
  r.window = info_.layer_window.empty() ? 0 : info_.layer_window[static_cast<size_t>(l)];
  return r;
}

void DecoderModel::llama_block(int64_t l, const Rows& rows, float* x, const BlockWeights& L, float scale,
                               const QKTransform& qk) const {
  const auto [N, d, H, Hkv, hd, F, Oqkv, eps] = dims(rows);
  float *xn = buf_.xn.data(), *wide = buf_.wide.data(), *tmp = buf_.tmp.data();
  // Attention block.
  ops::rmsnorm_f32(x, L.attn_norm.data_ptr<float>(), N, d, eps, xn);
  L.wqkv.forward(xn, N, wide, Oqkv);
  qk(wide, Oqkv);
  attend(l, rows, wide, Oqkv, scale, xn);
  L.wo.forward(xn, N, tmp, d);
  ops::add_rows(x, tmp, N, d, d);
  // MLP block.
  ops::rmsnorm_f32(x, L.ffn_norm.data_ptr<float>(), N, d, eps, xn);
  L.wgu.forward(xn, N, wide, 2 * F);
  ops::silu_mul(wide, N, F, xn);
  L.wdown.forward(xn, N, tmp, d);
  ops::add_rows(x, tmp, N, d, d);
}

void DecoderModel::attend(int64_t l, const Rows& rows, const float* qkv, int64_t ld, float scale, float* out) const {
  const int64_t H = info_.n_heads, Hkv = info_.n_kv_heads, hd = info_.head_dim;
  for (size_t s = 0; s < rows.seqs.size(); ++s) {
    KVCache& c = *rows.seqs[s].cache;
    const int64_t r0 = rows.row0[s], T = rows.row0[s + 1] - r0, cap = c.capacity(l), past = c.size();
    float* K = c.keys(l);
    float* V = c.values(l);
    for (int64_t t = 0; t < T; ++t) {
      const float* r = qkv + (r0 + t) * ld;
      const int64_t row = (past + t) % cap;
      for (int64_t g = 0; g < Hkv; ++g) {
        std::memcpy(K + (g * cap + row) * hd, r + (H + g) * hd, sizeof(float) * hd);
        std::memcpy(V + (g * cap + row) * hd, r + (H + Hkv + g) * hd, sizeof(float) * hd);
      }
    }
    const float* q = qkv + r0 * ld;
    float* o = out + r0 * H * hd;
    if (c.window(l) > 0)
      ops::attention_window(q, ld, K, V, cap, past, T, H, Hkv, hd, c.window(l), scale, o);
    else
      ops::attention(q, ld, K, V, cap, past, T, H, Hkv, hd, scale, o);
  }
}

std::vector<ForwardOut> DecoderModel::forward(std::span<ForwardSeq> batch, const TapRequest& taps) {
  const int64_t d = info_.hidden, V = info_.vocab;
  const int64_t n_seq = static_cast<int64_t>(batch.size());
  Rows rows{batch, std::vector<int64_t>(static_cast<size_t>(n_seq) + 1, 0), {}};

  // Validate everything before touching any cache.
  for (int64_t s = 0; s < n_seq; ++s) {
    const auto& q = batch[s];
    if (!q.cache) throw InvalidArgument("forward: sequence " + std::to_string(s) + " has no cache");
    for (TokenId t : q.tokens) {
      if (t < 0 || t >= V)
        throw InvalidArgument("forward: token id " + std::to_string(t) + " outside the vocabulary [0, " +
                              std::to_string(V) + ")");
    }
    if (q.cache->size() + static_cast<int64_t>(q.tokens.size()) > q.cache->max_tokens()) {
      throw InvalidArgument("context length exceeded: " + std::to_string(q.cache->size() + q.tokens.size()) +
                            " tokens needed, the context holds " + std::to_string(q.cache->max_tokens()));
    }
    rows.row0[s + 1] = rows.row0[s] + static_cast<int64_t>(q.tokens.size());
  }
  // Slots of the taps output filled by each layer (a layer may be listed twice).
  std::vector<std::vector<int64_t>> tap_slots(static_cast<size_t>(info_.n_layers));
  for (size_t i = 0; i < taps.layers.size(); ++i) {
    const int l = taps.layers[i];
    if (l < 0 || l >= info_.n_layers)
      throw InvalidArgument("forward: tap layer " + std::to_string(l) + " outside [0, " +
                            std::to_string(info_.n_layers) + ")");
    tap_slots[static_cast<size_t>(l)].push_back(static_cast<int64_t>(i));
  }
  for (auto& q : batch) q.cache->reserve_more(static_cast<int64_t>(q.tokens.size()));
  const int64_t N = rows.n(), m = static_cast<int64_t>(taps.layers.size());

  std::vector<ForwardOut> out(static_cast<size_t>(n_seq));
  if (N == 0) return out;

  std::vector<float> x(static_cast<size_t>(N * d));  // [N, d] residual stream
  rows.pos.resize(static_cast<size_t>(N));
  for (int64_t s = 0; s < n_seq; ++s) {
    embed(batch[s].tokens, x.data() + rows.row0[s] * d);
    for (int64_t t = 0; t < rows.row0[s + 1] - rows.row0[s]; ++t) rows.pos[rows.row0[s] + t] = batch[s].cache->size() + t;
  }
  std::vector<float*> tap_ptr(static_cast<size_t>(n_seq), nullptr);
  if (m > 0) {
    for (int64_t s = 0; s < n_seq; ++s) {
      out[s].taps = at::empty({rows.row0[s + 1] - rows.row0[s], m * d}, at::kFloat);
      tap_ptr[s] = out[s].taps.data_ptr<float>();
    }
  }

  const int64_t H = info_.n_heads, hd = info_.head_dim, F = info_.ffn;
  buf_.xn.resize(static_cast<size_t>(N * std::max({d, H * hd, F})));
  buf_.wide.resize(static_cast<size_t>(N * std::max((H + 2 * info_.n_kv_heads) * hd, 2 * F)));
  buf_.tmp.resize(static_cast<size_t>(N * d));
  for (int64_t l = 0; l < info_.n_layers; ++l) {
    block(l, rows, x.data());
    for (const int64_t slot : tap_slots[static_cast<size_t>(l)]) {
      for (int64_t s = 0; s < n_seq; ++s)
        for (int64_t t = 0; t < rows.row0[s + 1] - rows.row0[s]; ++t)
          std::memcpy(tap_ptr[s] + t * m * d + slot * d, x.data() + (rows.row0[s] + t) * d, sizeof(float) * d);
    }
  }

  // Final norm, hidden taps and logits for the requested rows only; the LM
  // head runs once over the logit rows of every sequence.
  const float* wn = out_norm_.data_ptr<float>();
  const float eps = static_cast<float>(info_.rms_eps);
  std::vector<float> xn(static_cast<size_t>(N * d));
  std::vector<int64_t> lrow0(static_cast<size_t>(n_seq) + 1, 0);
  for (int64_t s = 0; s < n_seq; ++s) {
    const int64_t T = rows.row0[s + 1] - rows.row0[s];
    const float* xs = x.data() + rows.row0[s] * d;
    if (taps.final_hidden) {
      out[s].final_hidden = at::empty({T, d}, at::kFloat);
      ops::rmsnorm_f32(xs, wn, T, d, eps, out[s].final_hidden.data_ptr<float>());
    }
    const int64_t n = batch[s].logits == Logits::All ? T : batch[s].logits == Logits::Last ? std::min<int64_t>(1, T) : 0;
    ops::rmsnorm_f32(xs + (T - n) * d, wn, n, d, eps, xn.data() + lrow0[s] * d);
    lrow0[s + 1] = lrow0[s] + n;
  }
  if (lrow0[n_seq] > 0) {
    at::Tensor logits = at::empty({lrow0[n_seq], V}, at::kFloat);
    head_logits(xn.data(), lrow0[n_seq], logits.data_ptr<float>());
    for (int64_t s = 0; s < n_seq; ++s)
      if (lrow0[s + 1] > lrow0[s]) out[s].logits = logits.narrow(0, lrow0[s], lrow0[s + 1] - lrow0[s]);
  }
  for (int64_t s = 0; s < n_seq; ++s) batch[s].cache->advance(rows.row0[s + 1] - rows.row0[s]);
  return out;
}

}  // namespace dspark
