// DSpark sequential heads and confidence head (DSpark Eq. 5-8), inference.
//
// For slot k (0-based) with previous token x_{k-1} (x_{-1} = anchor) and
// backbone hidden h_k:
//   e      = W1[x_{k-1}]                                   [r]
//   none:    B = 0
//   markov:  B = W2 e                                      (Eq. 5)
//   gated:   B = W2 (σ(W_g [h_k; e] + b_g) ⊙ e)
//   rnn:     g,c,o = split(W [s; e; h_k] + b); s = σ(g)⊙s + (1-σ(g))⊙tanh(c);
//            B = W2 tanh(o)                                (Eq. 6, s_0 = 0)
//   elman:   s = tanh(W_H s + e + b_H); B = W_O s
//   logits = LMHead(h_k) + B;  z_k = w·[h_k; e] + b        (Eq. 7, σ(z) = c_k)
// With a draft vocabulary, LMHead and the rows of B are restricted to it.
#include <cmath>

#include <ATen/Parallel.h>

#include "dspark/error.hpp"
#include "dspark/ops/kernels.hpp"
#include "dspark/speculative/drafter.hpp"

namespace dspark {

namespace {

// y[O] = W [O, K] · x[K] (fp32 in, bf16 products).
std::vector<float> matvec(const ops::Linear& W, const std::vector<float>& x) {
  std::vector<float> y(static_cast<size_t>(W.rows()));
  W.forward(x.data(), 1, y.data(), W.rows());
  return y;
}

float sigmoid(float v) { return 1.f / (1.f + std::exp(-v)); }

// B[V] = W [V, r] · x[r] from W's fp32 transpose cut into column chunks,
// Wc [C, r, kRankChunk] (Drafter::bind; zero-padded past V): one pass over
// each chunk per rank component, the chunks split across threads. Each B[v]
// is the same sequence of operations however V is cut (ops::weighted_rows).
std::vector<float> rank_product(const at::Tensor& Wc, const std::vector<float>& x) {
  const int64_t C = Wc.size(0), r = Wc.size(1), D = Wc.size(2);
  std::vector<float> y(static_cast<size_t>(C * D), 0.f);
  const float* w = Wc.data_ptr<float>();
  at::parallel_for(0, C, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) ops::weighted_rows(x.data(), w + c * r * D, r, D, y.data() + c * D);
  });
  return y;
}

}  // namespace

Draft Drafter::draft(const DraftState& st, TokenId anchor, int gamma,
                     const SamplingParams& sampling, Rng& rng) const {
  const int64_t G = gamma > 0 ? gamma : cfg_.gamma, d = cfg_.hidden, r = cfg_.markov_rank;
  if (anchor < 0 || anchor >= cfg_.vocab) throw InvalidArgument("drafter: anchor id outside the vocabulary");
  // Output rows: the draft vocabulary (row i is token vocab_ids_[i]) or all.
  const int64_t V = head_.rows();
  auto token_of = [&](int64_t row) {
    return vocab_ids_.empty() ? static_cast<TokenId>(row) : vocab_ids_[static_cast<size_t>(row)];
  };
  at::Tensor h = block_hidden(st, anchor, static_cast<int>(G));  // [γ, d]
  // U = LMHead(h): [γ, V] in one pass over the (shared) LM head, the target's softcap applied.
  const float* hp = h.data_ptr<float>();
  std::vector<float> U(static_cast<size_t>(G * V));
  target_->head_logits(hp, G, U.data(), &head_);

  const at::Tensor& W1 = w("markov_w1.weight");  // [V, r] bf16
  const float* cw = w("conf_proj.weight").data_ptr<float>();  // [1, d + r]
  const float cb = w("conf_proj.bias").data_ptr<float>()[0];
  std::vector<float> s(static_cast<size_t>(r), 0.f);  // recurrent state (rnn, elman)

  Draft out;
  out.tokens.reserve(G);
  TokenId prev = anchor;
  for (int64_t k = 0; k < G; ++k) {
    const float* hk = hp + k * d;
    std::vector<float> e(static_cast<size_t>(r));
    const at::BFloat16* w1row = W1.data_ptr<at::BFloat16>() + static_cast<int64_t>(prev) * r;
    for (int64_t i = 0; i < r; ++i) e[i] = static_cast<float>(w1row[i]);

    double z = cb;
    for (int64_t i = 0; i < d; ++i) z += static_cast<double>(cw[i]) * hk[i];
    for (int64_t i = 0; i < r; ++i) z += static_cast<double>(cw[d + i]) * e[i];
    out.conf_logits.push_back(static_cast<float>(z));

    float* logits = U.data() + k * V;
    std::vector<float> B;
    switch (cfg_.seq_head) {
      case SeqHead::None: break;
      case SeqHead::Markov: B = rank_product(w("markov_w2.weight.t"), e); break;
      case SeqHead::Gated: {
        std::vector<float> he(hk, hk + d);
        he.insert(he.end(), e.begin(), e.end());
        auto g = matvec(lin("markov_gate.weight"), he);
        const float* gb = w("markov_gate.bias").data_ptr<float>();
        for (int64_t i = 0; i < r; ++i) g[i] = sigmoid(g[i] + gb[i]) * e[i];
        B = rank_product(w("markov_w2.weight.t"), g);
        break;
      }
      case SeqHead::Rnn: {
        std::vector<float> zin(s);
        zin.insert(zin.end(), e.begin(), e.end());
        zin.insert(zin.end(), hk, hk + d);
        auto gco = matvec(lin("rnn.weight"), zin);
        const float* rb = w("rnn.bias").data_ptr<float>();
        std::vector<float> o(static_cast<size_t>(r));
        for (int64_t i = 0; i < r; ++i) {
          const float g = sigmoid(gco[i] + rb[i]);
          const float c = std::tanh(gco[r + i] + rb[r + i]);
          s[i] = g * s[i] + (1.f - g) * c;
          o[i] = std::tanh(gco[2 * r + i] + rb[2 * r + i]);
        }
        B = rank_product(w("markov_w2.weight.t"), o);
        break;
      }
      case SeqHead::Elman: {
        auto a = matvec(lin("elman.wh"), s);
        const float* bh = w("elman.bh").data_ptr<float>();
        for (int64_t i = 0; i < r; ++i) s[i] = std::tanh(a[i] + e[i] + bh[i]);
        B = rank_product(w("elman.wo.t"), s);
        break;
      }
    }
    if (!B.empty())
      for (int64_t v = 0; v < V; ++v) logits[v] += B[v];

    TokenId x;
    if (sampling.greedy()) {
      x = token_of(argmax(logits, V));
    } else {
      // Rows ascend with token ids, so mapping keeps the distribution's
      // order (descending probability, ties by ascending id).
      Distribution q = process_logits(logits, V, sampling);
      for (TokenId& id : q.ids) id = token_of(id);
      x = draw(q, sampling, rng, st.n_ctx + 1 + k);  // slot k predicts position n_ctx + 1 + k
      out.q.push_back(std::move(q));
    }
    out.tokens.push_back(x);
    prev = x;
  }
  return out;
}

}  // namespace dspark
