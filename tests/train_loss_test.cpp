// Tests for the training targets and the DSpark loss (dspark-method.md §4):
// the alignment of every slot (label = token p+1+j, target distribution from
// position p+j, teacher-forced previous token p+j, context strictly before p,
// cumulative validity), anchor eligibility and sampling, the loss value
// against an independent closed form, and the acceptance statistics.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "dspark/error.hpp"
#include "dspark/spec/drafter.hpp"
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
  // visible context: the same anchor twice in a batch gives the same output.
  GraphOut o5 = graph.forward(params, feats, at::tensor({9, 9}, at::kLong), prev.narrow(0, 1, 1).repeat({2, 1}));
  EXPECT_TRUE(at::allclose(o5.logits[0], o5.logits[1], 0, 1e-6));
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

}  // namespace
