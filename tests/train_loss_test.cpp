// Tests for the training targets and the DSpark loss (dspark-method.md §4):
// the alignment of every slot (label = token p+1+j, target distribution from
// position p+j, teacher-forced previous token p+j, context strictly before p,
// cumulative validity), anchor eligibility and sampling, the loss value
// against an independent closed form, and the acceptance statistics; with a
// draft vocabulary: the label mapping, the restricted target distribution,
// the loss against a computation from full-vocabulary tensors and the
// acceptance against the target's full-vocabulary argmax.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "dspark/error.hpp"
#include "dspark/speculative/drafter.hpp"
#include "dspark/train/drafter_graph.hpp"
#include "dspark/train/loss.hpp"

namespace {

using namespace dspark;
using namespace dspark::train;

// Sequence of 20 tokens (token at t is 100 + t): prompt 0..4, response
// 5..14, a second prompt 15..16, response 17..19.
std::vector<TokenId> tokens20() {
  std::vector<TokenId> t(20);
  for (int i = 0; i < 20; ++i) t[i] = 100 + i;
  return t;
}
std::vector<uint8_t> mask20() {
  std::vector<uint8_t> m(20, 0);
  for (int i = 5; i <= 14; ++i) m[i] = 1;
  for (int i = 17; i <= 19; ++i) m[i] = 1;
  return m;
}

TEST(TrainLoss, EligibleAnchorsNeedSupervisedAnchorAndNextToken) {
  const auto m = mask20();
  std::vector<int64_t> expect;
  for (int64_t p = 5; p <= 13; ++p) expect.push_back(p);
  expect.push_back(17);
  expect.push_back(18);
  EXPECT_EQ(eligible_anchors(m), expect);
  // Position 0 is never an anchor (no context), nor the last position.
  std::vector<uint8_t> all(6, 1);
  EXPECT_EQ(eligible_anchors(all), (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_TRUE(eligible_anchors(std::vector<uint8_t>{}).empty());
}

TEST(TrainLoss, AnchorSamplingIsDistinctSortedAndSeeded) {
  const auto m = mask20();
  std::mt19937_64 r1(42), r2(42);
  auto a = sample_anchors(m, 4, r1);
  auto b = sample_anchors(m, 4, r2);
  EXPECT_EQ(a, b);
  ASSERT_EQ(a.size(), 4u);
  EXPECT_TRUE(std::is_sorted(a.begin(), a.end()));
  EXPECT_EQ(std::set<int64_t>(a.begin(), a.end()).size(), 4u);
  const auto elig = eligible_anchors(m);
  for (int64_t p : a) EXPECT_NE(std::find(elig.begin(), elig.end(), p), elig.end());
  std::mt19937_64 r3(1);
  EXPECT_EQ(sample_anchors(m, 100, r3), elig);
  // Different seeds visit different subsets (over many draws, every anchor is drawn).
  std::set<int64_t> seen;
  std::mt19937_64 r4(7);
  for (int i = 0; i < 50; ++i)
    for (int64_t p : sample_anchors(m, 2, r4)) seen.insert(p);
  EXPECT_EQ(seen.size(), elig.size());
}

TEST(TrainLoss, SlotTargetsAreAlignedAndCumulative) {
  const auto tok = tokens20();
  const auto m = mask20();
  const std::vector<int64_t> anchors = {5, 12, 13, 18};
  const int G = 4;
  SlotTargets t = make_slot_targets(tok, m, anchors, G);
  ASSERT_EQ(t.labels.sizes(), (std::vector<int64_t>{4, G}));
  for (size_t i = 0; i < anchors.size(); ++i) {
    const int64_t p = anchors[i];
    EXPECT_EQ(t.anchors[i].item<int64_t>(), p);
    bool ok = true;
    for (int64_t j = 0; j < G; ++j) {
      // The teacher-forced previous token of slot j is the token at p+j (the anchor for j = 0).
      if (p + j < 20) {
        EXPECT_EQ(t.prev_tokens[i][j].item<int64_t>(), 100 + p + j) << p << "," << j;
      }
      // Its target distribution comes from position p+j.
      EXPECT_EQ(t.target_pos[i][j].item<int64_t>(), std::min<int64_t>(p + j, 19));
      ok = ok && p + 1 + j < 20 && m[p + 1 + j];
      EXPECT_EQ(t.valid[i][j].item<bool>(), ok) << p << "," << j;
      // Slot j predicts the token at p+1+j.
      if (ok) {
        EXPECT_EQ(t.labels[i][j].item<int64_t>(), 100 + p + 1 + j);
      }
    }
  }
  // Spelled out: anchor 12 → slots predict 13, 14, then position 15 is a
  // prompt token, so slots 2 and 3 are invalid even though 17 is supervised.
  EXPECT_EQ(t.valid[1].to(at::kInt).sum().item<int64_t>(), 2);
  EXPECT_EQ(t.labels[1][0].item<int64_t>(), 113);
  EXPECT_EQ(t.labels[1][1].item<int64_t>(), 114);
  // Anchor 13: only slot 0 (token 14).
  EXPECT_EQ(t.valid[2].to(at::kInt).sum().item<int64_t>(), 1);
  // Anchor 18: slot 0 predicts 19, slot 1 would be past the end.
  EXPECT_EQ(t.valid[3].to(at::kInt).sum().item<int64_t>(), 1);
  EXPECT_EQ(t.labels[3][0].item<int64_t>(), 119);

  EXPECT_THROW(make_slot_targets(tok, m, std::vector<int64_t>{20}, G), InvalidArgument);
  EXPECT_THROW(make_slot_targets(tok, std::vector<uint8_t>(3, 1), anchors, G), InvalidArgument);
  EXPECT_THROW(make_slot_targets(tok, m, anchors, 0), InvalidArgument);
}

// A synthetic target whose next-token distribution at position t is known in
// closed form: LM head = identity (V = d), final-normed hidden at t = a·e_{f(t)},
// so p^t_t(v) = exp(a·[v = f(t)]) / (exp(a) + V - 1).
TEST(TrainLoss, TargetDistributionOfSlotJComesFromPositionPPlusJ) {
  const int64_t V = 8, L = 20;
  auto f = [&](int64_t t) { return (3 * t + 1) % V; };
  auto a_of = [](int64_t t) { return 0.5 + 0.25 * static_cast<double>(t); };
  at::Tensor head = at::eye(V, at::kFloat);
  at::Tensor fh = at::zeros({L, V}, at::kFloat);
  for (int64_t t = 0; t < L; ++t) fh[t][f(t)] = a_of(t);
  const std::vector<int64_t> anchors = {5, 9, 12};
  SlotTargets t = make_slot_targets(tokens20(), mask20(), anchors, 4);
  at::Tensor pt = target_probs(fh, head, t.target_pos, 0.0, MatmulPrecision::Float32);
  ASSERT_EQ(pt.sizes(), (std::vector<int64_t>{3, 4, V}));
  for (size_t i = 0; i < anchors.size(); ++i) {
    for (int64_t j = 0; j < 4; ++j) {
      const int64_t pos = anchors[i] + j;
      const double z = std::exp(a_of(pos)) + static_cast<double>(V - 1);
      for (int64_t v = 0; v < V; ++v) {
        const double expect = (v == f(pos) ? std::exp(a_of(pos)) : 1.0) / z;
        EXPECT_NEAR(pt[i][j][v].item<double>(), expect, 1e-6) << "anchor " << anchors[i] << " slot " << j;
      }
    }
  }
  // Softcap: logits ← c·tanh(logits/c).
  at::Tensor pc = target_probs(fh, head, t.target_pos, 2.0, MatmulPrecision::Float32);
  const int64_t pos = 5;
  const double za = 2.0 * std::tanh(a_of(pos) / 2.0);
  EXPECT_NEAR(pc[0][0][f(pos)].item<double>(), std::exp(za) / (std::exp(za) + V - 1), 1e-6);
  // bf16 head product: same distribution up to bf16 rounding.
  at::Tensor pb = target_probs(fh, head, t.target_pos, 0.0, MatmulPrecision::BFloat16);
  EXPECT_LT((pb - pt).abs().max().item<double>(), 2e-2);
}

// The drafter sees context rows < p only: perturbing rows >= p leaves an
// anchor's outputs unchanged, perturbing row p-1 changes them.
TEST(TrainLoss, ContextIsStrictlyBeforeTheAnchor) {
  DrafterConfig c;
  c.gamma = 3;
  c.n_layers = 2;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.head_dim = 16;
  c.ffn = 64;
  c.markov_rank = 32;
  c.tap_layers = {0};
  c.hidden = 32;
  c.vocab = 64;
  c.validate();
  Drafter d = Drafter::init(c, 1);
  at::Generator g = at::detail::createCPUGenerator(2);
  auto params = d.params();
  for (auto& [name, p] : params)
    if (p.dim() == 2) p = at::empty(p.sizes(), at::kFloat).normal_(0, 0.2, g);
  at::Tensor embed = at::empty({64, 32}).normal_(0, 1, g), head = at::empty({64, 32}).normal_(0, 0.2, g);
  DrafterGraph graph(c, embed, head, GraphOptions{MatmulPrecision::Float32});
  const int64_t L = 16;
  at::Tensor feats = at::empty({L, 32}).normal_(0, 1, g);
  at::Tensor anchors = at::tensor({4, 9, 16}, at::kLong);
  at::Tensor prev = at::randint(64, {3, 3}, g, at::kLong);
  GraphOut base = graph.forward(params, feats, anchors, prev);

  at::Tensor f2 = feats.clone();
  f2.narrow(0, 4, L - 4).add_(3.0);  // rows >= 4
  GraphOut o2 = graph.forward(params, f2, anchors, prev);
  EXPECT_TRUE(at::allclose(o2.logits[0], base.logits[0], 0, 1e-6));
  EXPECT_TRUE(at::allclose(o2.conf_logits[0], base.conf_logits[0], 0, 1e-6));
  EXPECT_FALSE(at::allclose(o2.logits[1], base.logits[1], 0, 1e-3));  // anchor 9 sees rows 4..8

  at::Tensor f3 = feats.clone();
  f3[3].add_(3.0);  // row p-1 of the first anchor
  GraphOut o3 = graph.forward(params, f3, anchors, prev);
  EXPECT_FALSE(at::allclose(o3.logits[0], base.logits[0], 0, 1e-3));

  at::Tensor f4 = feats.clone();
  f4[15].add_(3.0);  // only the last anchor (p = 16 = L) sees row 15
  GraphOut o4 = graph.forward(params, f4, anchors, prev);
  EXPECT_TRUE(at::allclose(o4.logits.narrow(0, 0, 2), base.logits.narrow(0, 0, 2), 0, 1e-6));
  EXPECT_FALSE(at::allclose(o4.logits[2], base.logits[2], 0, 1e-3));

  // An anchor's block depends on its own position only through RoPE and the
  // visible context: the same anchor twice in a batch gives the same output
  // (to rounding: a BLAS may sum the rows of one product differently).
  GraphOut o5 = graph.forward(params, feats, at::tensor({9, 9}, at::kLong), prev.narrow(0, 1, 1).repeat({2, 1}));
  EXPECT_TRUE(at::allclose(o5.logits[0], o5.logits[1], 1e-5, 1e-5));
  EXPECT_TRUE(at::allclose(o5.logits[0], base.logits[1], 1e-5, 1e-5));
}

// The loss against a direct evaluation of Eq. 9-12 in plain C++.
TEST(TrainLoss, LossMatchesClosedForm) {
  const int64_t N = 2, G = 3, V = 5;
  std::mt19937_64 rng(3);
  std::normal_distribution<double> nd;
  at::Tensor logits = at::empty({N, G, V}, at::kDouble), pt_logits = at::empty({N, G, V}, at::kDouble);
  at::Tensor z = at::empty({N, G}, at::kDouble);
  for (int64_t i = 0; i < N * G * V; ++i) {
    logits.view({-1})[i] = nd(rng);
    pt_logits.view({-1})[i] = 2 * nd(rng);
  }
  for (int64_t i = 0; i < N * G; ++i) z.view({-1})[i] = nd(rng);
  at::Tensor pt = at::softmax(pt_logits, -1);
  SlotTargets t;
  t.anchors = at::tensor({1, 2}, at::kLong);
  t.labels = at::tensor({1, 4, 0, 2, 3, 3}, at::kLong).view({N, G});
  t.valid = at::tensor({1, 1, 0, 1, 1, 1}, at::kInt).to(at::kBool).view({N, G});
  t.prev_tokens = at::zeros({N, G}, at::kLong);
  t.target_pos = at::zeros({N, G}, at::kLong);
  GraphOut out{at::Tensor(), logits, z};
  LossOptions opts;  // 0.1, 0.9, 1.0, decay 4
  LossTerms r = dspark_loss(out, pt, t, opts);

  double ce = 0, l1 = 0, bce = 0, wsum = 0;
  for (int64_t i = 0; i < N; ++i) {
    for (int64_t j = 0; j < G; ++j) {
      if (!t.valid[i][j].item<bool>()) continue;
      const double w = std::exp(-static_cast<double>(j) / 4.0);
      double mx = -1e300, s = 0;
      for (int64_t v = 0; v < V; ++v) mx = std::max(mx, logits[i][j][v].item<double>());
      for (int64_t v = 0; v < V; ++v) s += std::exp(logits[i][j][v].item<double>() - mx);
      double dist = 0;
      for (int64_t v = 0; v < V; ++v)
        dist += std::abs(std::exp(logits[i][j][v].item<double>() - mx) / s - pt[i][j][v].item<double>());
      const int64_t y = t.labels[i][j].item<int64_t>();
      const double c = std::clamp(1.0 - 0.5 * dist, 0.0, 1.0);
      const double zz = z[i][j].item<double>();
      const double sig = 1.0 / (1.0 + std::exp(-zz));
      ce += w * (-(logits[i][j][y].item<double>() - mx - std::log(s)));
      l1 += w * dist;
      bce += w * -(c * std::log(sig) + (1 - c) * std::log(1 - sig));
      wsum += w;
    }
  }
  EXPECT_NEAR(r.weight_sum, wsum, 1e-12);
  EXPECT_NEAR(slot_weight_sum(t.valid, 4.0), wsum, 1e-12);
  EXPECT_NEAR(r.ce, ce, 1e-9);
  EXPECT_NEAR(r.l1, l1, 1e-9);
  EXPECT_NEAR(r.bce, bce, 1e-9);
  EXPECT_NEAR(r.total.item<double>(), (0.1 * ce + 0.9 * l1 + 1.0 * bce) / wsum, 1e-9);
  // With an external normalizer the total scales accordingly.
  LossTerms r2 = dspark_loss(out, pt, t, opts, 10.0);
  EXPECT_NEAR(r2.total.item<double>(), (0.1 * ce + 0.9 * l1 + 1.0 * bce) / 10.0, 1e-9);
  // A drafter equal to the target: L1 = 0 and c* = 1 on every slot.
  GraphOut same{at::Tensor(), pt.log(), z};
  LossTerms r3 = dspark_loss(same, pt, t, opts);
  EXPECT_NEAR(r3.l1, 0.0, 1e-9);
  EXPECT_TRUE(at::allclose(r3.c_star, at::ones_like(r3.c_star)));
  // No gradient flows into the confidence label.
  at::Tensor lg = logits.clone().requires_grad_(true);
  GraphOut o4{at::Tensor(), lg, z};
  LossOptions only_bce{0.0, 0.0, 1.0, 4.0};
  dspark_loss(o4, pt, t, only_bce).total.backward();
  EXPECT_TRUE(!lg.grad().defined() || lg.grad().abs().max().item<double>() == 0.0);
}

// Off the CPU (and with LossOptions::kernels false) the loss runs in ATen
// ops: the same values and gradients as the fused CPU kernel, with full and
// draft-vocabulary labels (-1: no CE term).
TEST(TrainLoss, AtenOpsLossEqualsTheFusedKernel) {
  const int64_t N = 3, G = 4, V = 7;
  at::manual_seed(5);
  const at::Tensor logits = at::randn({N, G, V}, at::kDouble) * 2;
  const at::Tensor pt = at::softmax(at::randn({N, G, V}, at::kDouble) * 3, -1) * 0.9;  // 0.1 outside
  const at::Tensor z = at::randn({N, G}, at::kDouble);
  SlotTargets t;
  t.anchors = at::tensor({1, 2, 3}, at::kLong);
  t.labels = at::randint(0, V, {N, G}, at::kLong);
  t.valid = at::tensor({1, 1, 1, 0, 1, 1, 0, 0, 1, 1, 1, 1}, at::kInt).to(at::kBool).view({N, G});
  t.prev_tokens = at::zeros({N, G}, at::kLong);
  t.target_pos = at::zeros({N, G}, at::kLong);
  for (const bool draft : {false, true}) {
    SCOPED_TRACE(draft ? "draft labels" : "labels");
    if (draft) t.draft_labels = t.labels.masked_fill(t.labels == 2, -1);
    for (const double w_kl : {0.0, 0.7}) {
      SCOPED_TRACE("w_kl " + std::to_string(w_kl));
      std::vector<double> terms[2];
      at::Tensor grads[2];
      for (const bool kernels : {true, false}) {
        const at::Tensor lg = logits.clone().requires_grad_(true), zg = z.clone().requires_grad_(true);
        LossOptions o;
        o.kernels = kernels;
        o.w_kl = w_kl;
        const LossTerms r = dspark_loss(GraphOut{at::Tensor(), lg, zg}, pt, t, o);
        r.total.backward();
        terms[kernels] = {r.ce, r.l1, r.bce, r.kl, r.total.item<double>()};
        grads[kernels] = at::cat({lg.grad().view({-1}), zg.grad().view({-1})});
      }
      for (size_t k = 0; k < 5; ++k) EXPECT_NEAR(terms[0][k], terms[1][k], 1e-12) << k;
      if (w_kl > 0) {
        EXPECT_GT(terms[1][3], 0.1);
      } else {
        EXPECT_EQ(terms[1][3], 0.0);  // not computed
      }
      EXPECT_GT(grads[1].abs().max().item<double>(), 1e-3);
      EXPECT_LT((grads[0] - grads[1]).abs().max().item<double>(), 1e-12);
    }
  }
}

// The forward KL term against its definition, and the gradient of the whole
// loss (the confidence label held fixed, as in training) with every term weighted (CE, L1, BCE, KL; equal position weights
// and exp(-j/4)) against central finite differences, on the fused kernel
// and the ATen-op path, with full and draft-vocabulary targets.
TEST(TrainLoss, KlTermAndGradientsAgainstFiniteDifferences) {
  const int64_t N = 2, G = 3, V = 6;
  at::manual_seed(11);
  const at::Tensor logits = at::randn({N, G, V}, at::kDouble) * 1.5;
  const at::Tensor z = at::randn({N, G}, at::kDouble);
  SlotTargets t;
  t.anchors = at::tensor({1, 2}, at::kLong);
  t.labels = at::randint(0, V, {N, G}, at::kLong);
  t.valid = at::tensor({1, 1, 1, 1, 1, 0}, at::kInt).to(at::kBool).view({N, G});
  t.prev_tokens = at::zeros({N, G}, at::kLong);
  t.target_pos = at::zeros({N, G}, at::kLong);
  for (const bool draft : {false, true}) {
    // A draft vocabulary leaves 15% of the target's mass outside; one target
    // probability is exactly 0 (xlogy: no term).
    at::Tensor pt = at::softmax(at::randn({N, G, V}, at::kDouble) * 2, -1) * (draft ? 0.85 : 1.0);
    pt[0][1][2] = 0.0;
    if (draft) t.draft_labels = t.labels.masked_fill(t.labels == 1, -1);
    for (const double decay : {4.0, 0.0}) {
      SCOPED_TRACE(std::string(draft ? "draft vocabulary" : "full vocabulary") + ", gamma_decay " +
                   std::to_string(decay));
      LossOptions o;
      o.w_ce = 0.3;
      o.w_l1 = 0.9;
      o.w_bce = 0.5;
      o.w_kl = 0.8;
      o.gamma_decay = decay;
      // The KL sum by its definition.
      double kl = 0, wsum = 0;
      for (int64_t i = 0; i < N; ++i)
        for (int64_t j = 0; j < G; ++j) {
          if (!t.valid[i][j].item<bool>()) continue;
          const double w = decay > 0 ? std::exp(-static_cast<double>(j) / decay) : 1.0;
          const at::Tensor logq = at::log_softmax(logits[i][j], -1);
          for (int64_t v = 0; v < V; ++v) {
            const double p = pt[i][j][v].item<double>();
            if (p > 0) kl += w * p * (std::log(p) - logq[v].item<double>());
          }
          wsum += w;
        }
      EXPECT_NEAR(slot_weight_sum(t.valid, decay), wsum, 1e-12);
      if (decay == 0) {
        EXPECT_EQ(wsum, 5.0);
      }
      for (const bool kernels : {true, false}) {
        SCOPED_TRACE(kernels ? "kernel" : "ATen ops");
        o.kernels = kernels;
        // c* (a function of the L1 term, no gradient by design) held fixed.
        const at::Tensor c_star = dspark_loss(GraphOut{at::Tensor(), logits, z}, pt, t, o).c_star;
        auto loss_at = [&](const at::Tensor& lg) {
          return dspark_loss(GraphOut{at::Tensor(), lg, z}, pt, t, o, 0.0, c_star).total.item<double>();
        };
        const at::Tensor lg = logits.clone().requires_grad_(true);
        const LossTerms r = dspark_loss(GraphOut{at::Tensor(), lg, z}, pt, t, o, 0.0, c_star);
        EXPECT_NEAR(r.kl, kl, 1e-12);
        EXPECT_NEAR(r.weight_sum, wsum, 1e-12);
        r.total.backward();
        const at::Tensor grad = lg.grad();
        double worst = 0;
        for (int64_t k = 0; k < logits.numel(); ++k) {
          const double h = 1e-6;
          at::Tensor up = logits.clone(), dn = logits.clone();
          up.view({-1})[k] += h;
          dn.view({-1})[k] -= h;
          const double fd = (loss_at(up) - loss_at(dn)) / (2 * h);
          worst = std::max(worst, std::abs(fd - grad.view({-1})[k].item<double>()));
        }
        EXPECT_LT(worst, 1e-7);
        EXPECT_GT(grad.abs().max().item<double>(), 1e-2);
      }
    }
  }
}

TEST(TrainLoss, AcceptanceStatistics) {
  // Two anchors, γ = 3. Anchor 0: drafter argmax matches the target at
  // slots 0 and 2 but not 1 → greedy τ = 2. Anchor 1: all match, but slot 2
  // is invalid → τ = 3.
  const int64_t V = 4;
  at::Tensor pt = at::full({2, 3, V}, 0.1, at::kFloat);
  at::Tensor lg = at::zeros({2, 3, V}, at::kFloat);
  const int tgt[2][3] = {{1, 2, 3}, {0, 0, 1}};
  const int dr[2][3] = {{1, 3, 3}, {0, 0, 1}};
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) {
      pt[i][j][tgt[i][j]] = 0.7;
      lg[i][j][dr[i][j]] = 5.0;
    }
  SlotTargets t;
  t.valid = at::tensor({1, 1, 1, 1, 1, 0}, at::kInt).to(at::kBool).view({2, 3});
  LossTerms l;
  l.c_star = at::tensor({0.5, 0.5, 0.5, 1.0, 0.8, 0.9}, at::kDouble).view({2, 3});
  GraphOut out{at::Tensor(), lg, at::zeros({2, 3})};
  AcceptanceStats s;
  accumulate_acceptance(out, pt, t, l, s);
  EXPECT_EQ(s.anchors, 2);
  EXPECT_DOUBLE_EQ(s.mean_tau_greedy(), (2.0 + 3.0) / 2);
  // τ_sample: anchor 0: 1 + .5 + .25 + .125; anchor 1: 1 + 1 + .8 + 0.
  EXPECT_DOUBLE_EQ(s.mean_tau_sample(), (1.875 + 2.8) / 2);
  EXPECT_EQ(s.reached, (std::vector<int64_t>{2, 2, 1}));
  EXPECT_EQ(s.accepted, (std::vector<int64_t>{2, 1, 0}));
  EXPECT_DOUBLE_EQ(s.acceptance_by_position()[1], 0.5);
}

// ---- draft vocabulary ----------------------------------------------------------

std::vector<int64_t> ints(const at::Tensor& t) {
  at::Tensor c = t.to(at::kLong).contiguous().view({-1});
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

TEST(TrainLoss, DraftLabelsAreRowsOfTheDraftVocab) {
  const auto tok = tokens20();  // token at t is 100 + t
  const auto m = mask20();
  const std::vector<TokenId> dv = {3, 106, 107, 109, 113, 500};
  SlotTargets t = make_slot_targets(tok, m, std::vector<int64_t>{5, 12}, 4, dv);
  SlotTargets t0 = make_slot_targets(tok, m, std::vector<int64_t>{5, 12}, 4);
  EXPECT_FALSE(t0.draft_labels.defined());
  ASSERT_TRUE(t.draft_labels.defined());
  // Everything else is unchanged by the draft vocabulary.
  EXPECT_TRUE(at::equal(t.labels, t0.labels));
  EXPECT_TRUE(at::equal(t.valid, t0.valid));
  // Anchor 5 predicts 106, 107, 108, 109 -> rows 1, 2, -1, 3.
  EXPECT_EQ(ints(t.draft_labels[0]), (std::vector<int64_t>{1, 2, -1, 3}));
  // Anchor 12 predicts 113, 114, then invalid slots -> 4, -1, -1, -1.
  EXPECT_EQ(ints(t.draft_labels[1]), (std::vector<int64_t>{4, -1, -1, -1}));
}

// Restricted target distributions: the full distribution at the draft
// vocabulary's columns, summing to the mass inside it; the logit statistics
// are the full logits' logsumexp and argmax.
TEST(TrainLoss, RestrictedTargetDistributionIsTheFullOneAtItsColumns) {
  const int64_t V = 300, d = 64, L = 20;
  at::Generator g = at::detail::createCPUGenerator(12);
  at::Tensor head = at::empty({V, d}).normal_(0, 0.4, g).to(at::kBFloat16);
  at::Tensor fh = at::empty({L, d}).normal_(0, 1, g);
  std::vector<TokenId> dv;
  for (TokenId v = 0; v < V; v += 4) dv.push_back(v);
  dv.push_back(V - 1);
  at::Tensor rows = at::tensor(std::vector<int64_t>(dv.begin(), dv.end()), at::kLong);
  at::Tensor head_rows = head.index_select(0, rows);
  SlotTargets t = make_slot_targets(tokens20(), mask20(), std::vector<int64_t>{5, 9, 19}, 4);
  for (auto prec : {MatmulPrecision::Float32, MatmulPrecision::BFloat16}) {
    for (double softcap : {0.0, 3.0}) {
      SCOPED_TRACE(std::string(prec == MatmulPrecision::Float32 ? "fp32" : "bf16") + " softcap " +
                   std::to_string(softcap));
      at::Tensor full = target_probs(fh, head, t.target_pos, softcap, prec);  // [3, 4, V]
      TargetLogitStats st = target_logit_stats(fh, head, softcap, prec);
      ASSERT_EQ(st.lse.sizes(), (std::vector<int64_t>{L}));
      ASSERT_EQ(st.argmax.scalar_type(), at::kLong);
      // The statistics against the full logits.
      at::Tensor logits = at::matmul(fh, head.to(at::kFloat).t());
      if (softcap > 0) logits = at::tanh(logits / softcap) * softcap;
      EXPECT_LT((st.lse - at::logsumexp(logits, -1)).abs().max().item<double>(), 3e-2);
      at::Tensor all = target_probs(fh, head, at::arange(L, at::kLong), softcap, prec);  // [L, V]
      EXPECT_TRUE(at::equal(st.argmax, all.argmax(-1)));

      at::Tensor sub = target_probs_sub(fh, head_rows, st.lse, t.target_pos, softcap, prec);
      ASSERT_EQ(sub.sizes(), (std::vector<int64_t>{3, 4, static_cast<int64_t>(dv.size())}));
      at::Tensor cols = full.index_select(2, rows);
      EXPECT_LT((sub - cols).abs().max().item<double>(), 1e-6);
      EXPECT_LT((sub.sum(-1) - cols.sum(-1)).abs().max().item<double>(), 1e-5);
      EXPECT_LT(sub.sum(-1).max().item<double>(), 0.9);  // a strict subset of the mass
    }
  }
  EXPECT_THROW(target_probs_sub(fh, head_rows, at::zeros({L - 1}), t.target_pos), InvalidArgument);
  EXPECT_THROW(target_probs_sub(fh, head_rows, at::zeros({L}), t.target_pos + L), InvalidArgument);
}

// The draft-vocabulary loss against its definition, computed from
// full-vocabulary tensors: q = softmax over the draft vocabulary (0
// elsewhere), p = the full target distribution, CE only for labels inside
// the draft vocabulary.
TEST(TrainLoss, DraftVocabLossMatchesFullVocabComputation) {
  const int64_t V = 12, G = 3;
  const std::vector<TokenId> dv = {1, 3, 4, 7, 8, 10};
  const int64_t Vd = static_cast<int64_t>(dv.size());
  at::Tensor ids = at::tensor(std::vector<int64_t>(dv.begin(), dv.end()), at::kLong);
  // Tokens: labels of anchor 1 are 3, 5 (outside), 7; anchor 4: 8, 10, then
  // a prompt token (invalid).
  const std::vector<TokenId> tokens = {0, 2, 3, 5, 7, 8, 10, 11, 6};
  const std::vector<uint8_t> mask = {0, 1, 1, 1, 1, 1, 1, 0, 1};
  SlotTargets t = make_slot_targets(tokens, mask, std::vector<int64_t>{1, 4}, G, dv);
  const int64_t N = 2;
  ASSERT_EQ(ints(t.draft_labels), (std::vector<int64_t>{1, -1, 3, 4, 5, -1}));
  ASSERT_EQ(ints(t.valid), (std::vector<int64_t>{1, 1, 1, 1, 1, 0}));

  std::mt19937_64 rng(21);
  std::normal_distribution<double> nd;
  at::Tensor full_logits = at::empty({N, G, V}, at::kDouble), pt_logits = at::empty({N, G, V}, at::kDouble);
  at::Tensor z = at::empty({N, G}, at::kDouble);
  for (int64_t i = 0; i < N * G * V; ++i) {
    full_logits.view({-1})[i] = nd(rng);
    pt_logits.view({-1})[i] = 2 * nd(rng);
  }
  for (int64_t i = 0; i < N * G; ++i) z.view({-1})[i] = nd(rng);
  at::Tensor p_full = at::softmax(pt_logits, -1);
  GraphOut out{at::Tensor(), full_logits.index_select(2, ids), z};
  LossOptions opts;
  LossTerms r = dspark_loss(out, p_full.index_select(2, ids), t, opts);

  double ce = 0, l1 = 0, bce = 0, wsum = 0;
  for (int64_t i = 0; i < N; ++i) {
    for (int64_t j = 0; j < G; ++j) {
      if (!t.valid[i][j].item<bool>()) continue;
      const double w = std::exp(-static_cast<double>(j) / 4.0);
      // q over the full vocabulary: softmax over dv, zero elsewhere.
      std::vector<double> q(V, 0.0);
      double s = 0;
      for (TokenId v : dv) s += std::exp(full_logits[i][j][v].item<double>());
      for (TokenId v : dv) q[v] = std::exp(full_logits[i][j][v].item<double>()) / s;
      double dist = 0;
      for (int64_t v = 0; v < V; ++v) dist += std::abs(q[v] - p_full[i][j][v].item<double>());
      const int64_t y = t.labels[i][j].item<int64_t>();
      const bool in_dv = std::find(dv.begin(), dv.end(), static_cast<TokenId>(y)) != dv.end();
      if (in_dv) ce += w * -std::log(q[y]);
      const double c = std::clamp(1.0 - 0.5 * dist, 0.0, 1.0);
      const double zz = z[i][j].item<double>();
      const double sig = 1.0 / (1.0 + std::exp(-zz));
      l1 += w * dist;
      bce += w * -(c * std::log(sig) + (1 - c) * std::log(1 - sig));
      wsum += w;
      EXPECT_NEAR(r.l1_slot[i][j].item<double>(), dist, 1e-12);
      EXPECT_NEAR(r.c_star[i][j].item<double>(), c, 1e-12);
    }
  }
  EXPECT_NEAR(r.weight_sum, wsum, 1e-12);
  EXPECT_NEAR(r.ce, ce, 1e-9);
  EXPECT_NEAR(r.l1, l1, 1e-9);
  EXPECT_NEAR(r.bce, bce, 1e-9);
  EXPECT_NEAR(r.total.item<double>(), (0.1 * ce + 0.9 * l1 + 1.0 * bce) / wsum, 1e-9);

  // A drafter equal to the target inside the draft vocabulary still pays the
  // outside mass: L1 = 1 − Σ_D p.
  GraphOut same{at::Tensor(), p_full.index_select(2, ids).log(), z};
  LossTerms r2 = dspark_loss(same, p_full.index_select(2, ids), t, opts);
  at::Tensor outside = 1.0 - p_full.index_select(2, ids).sum(-1);
  at::Tensor q_same = at::softmax(p_full.index_select(2, ids).log(), -1);
  at::Tensor expect_l1 = (q_same - p_full.index_select(2, ids)).abs().sum(-1) + outside;
  EXPECT_TRUE(at::allclose(r2.l1_slot, expect_l1, 1e-12, 1e-12));
  // Out-of-range draft labels are refused.
  SlotTargets bad = t;
  bad.draft_labels = t.draft_labels.clone();
  bad.draft_labels[0][0] = Vd;
  EXPECT_THROW(dspark_loss(out, p_full.index_select(2, ids), bad, opts), InvalidArgument);
  bad.draft_labels[0][0] = -2;
  EXPECT_THROW(dspark_loss(out, p_full.index_select(2, ids), bad, opts), InvalidArgument);
}

TEST(TrainLoss, DraftVocabAcceptanceUsesTheTargetsFullArgmax) {
  // Draft vocabulary {2, 5, 9}; logit rows 0..2. Anchor 0: drafted 5, 9, 2
  // vs target 5, 9, 4 (4 is outside the draft vocabulary: rejected) ->
  // τ = 3. Anchor 1: drafted 2 vs target 5 -> τ = 1.
  const at::Tensor ids = at::tensor({2, 5, 9}, at::kLong);
  at::Tensor lg = at::zeros({2, 3, 3}, at::kFloat);
  const int dr[2][3] = {{1, 2, 0}, {0, 0, 0}};
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) lg[i][j][dr[i][j]] = 1.0;
  at::Tensor target_argmax = at::tensor({5, 9, 4, 5, 5, 5}, at::kLong).view({2, 3});
  SlotTargets t;
  t.valid = at::ones({2, 3}, at::kBool);
  LossTerms l;
  l.c_star = at::full({2, 3}, 0.5, at::kDouble);
  GraphOut out{at::Tensor(), lg, at::zeros({2, 3})};
  AcceptanceStats s;
  accumulate_acceptance(out, target_argmax, ids, t, l, s);
  EXPECT_EQ(s.anchors, 2);
  EXPECT_DOUBLE_EQ(s.mean_tau_greedy(), (3.0 + 1.0) / 2);
  EXPECT_EQ(s.reached, (std::vector<int64_t>{2, 1, 1}));
  EXPECT_EQ(s.accepted, (std::vector<int64_t>{1, 1, 0}));
  EXPECT_DOUBLE_EQ(s.mean_tau_sample(), 1.875);
  // Without vocab_ids the rows are token ids: row 1 is token 1, never 5.
  AcceptanceStats s2;
  accumulate_acceptance(out, target_argmax, at::Tensor(), t, l, s2);
  EXPECT_DOUBLE_EQ(s2.mean_tau_greedy(), 1.0);
  EXPECT_THROW(accumulate_acceptance(out, target_argmax, at::tensor({2, 5}, at::kLong), t, l, s2),
               InvalidArgument);
}

}  // namespace
