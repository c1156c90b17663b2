// Tests for the differentiable drafter forward (DrafterGraph):
//  - parity with the inference path (Drafter::block_hidden / Drafter::draft)
//    for every sequential head, in fp32 and bf16 matmul precision: the
//    backbone hidden states, the confidence logits, the greedy tokens and the
//    full sampling distributions, teacher-forced on the tokens the inference
//    path drafted, for several anchors of one sequence in one batch;
//  - the gradient of the full loss against central finite differences in
//    double precision for parameters of every group;
//  - with a draft vocabulary: the logits equal the full-vocabulary logits at
//    its columns (and so do the gradients through them), the sampling
//    distribution equals the inference path's, and the draft-vocabulary loss
//    passes the same gradient check.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "dspark/error.hpp"
#include "dspark/model/target.hpp"
#include "dspark/speculative/drafter.hpp"
#include "dspark/speculative/sampling.hpp"
#include "dspark/train/drafter_graph.hpp"
#include "dspark/train/loss.hpp"
#include "test_util.hpp"

namespace {

using namespace dspark;
using namespace dspark::train;

const std::vector<SeqHead> kHeads = {SeqHead::None, SeqHead::Markov, SeqHead::Gated, SeqHead::Rnn,
                                     SeqHead::Elman};

// Replaces every parameter (the zero-initialized ones included) by random
// values of a scale that makes every path matter, rounded to bf16-exact
// values so that the inference copies hold the same numbers.
void perturb(std::map<std::string, at::Tensor>& params, uint64_t seed) {
  at::Generator g = at::detail::createCPUGenerator(seed);
  for (auto& [name, p] : params) {
    at::Tensor n = at::empty(p.sizes(), at::kFloat).normal_(0.0, 1.0, g);
    at::Tensor v;
    if (name.find("norm") != std::string::npos) v = 1.0 + 0.1 * n;
    else if (name == "markov_w1.weight") v = n;
    else if (p.dim() == 2) v = n / std::sqrt(static_cast<double>(p.size(1)));
    else v = 0.5 * n;
    p = v.to(at::kBFloat16).to(at::kFloat).contiguous();
  }
}

struct TinyTarget {
  test::TempDir dir;
  std::unique_ptr<TargetModel> model;
  TinyTarget() {
    test::write_tiny_llama(dir.file("tiny.gguf"), 1234);
    model = load_target(dir.file("tiny.gguf"));
  }
};

TinyTarget& tiny() {
  static TinyTarget t;
  return t;
}

// Dense [V] vector of a sparse distribution.
std::vector<double> dense(const Distribution& q, int64_t V) {
  std::vector<double> v(static_cast<size_t>(V), 0.0);
  for (size_t i = 0; i < q.size(); ++i) v[static_cast<size_t>(q.ids[i])] = q.probs[i];
  return v;
}

struct ParityErrors {
  double hidden = 0, conf = 0, prob = 0, tie = 0;
};

// A draft vocabulary of every third token id plus a few others: not a
// multiple of 32 rows, ids not contiguous.
std::vector<TokenId> test_draft_vocab(int64_t V) {
  std::vector<TokenId> dv;
  for (TokenId t = 0; t < V; ++t)
    if (t % 3 == 1 || t == 2 || t == V - 1) dv.push_back(t);
  return dv;
}

ParityErrors check_parity(SeqHead head, int mask_token, MatmulPrecision precision,
                          bool with_draft_vocab = false) {
  TargetModel& target = *tiny().model;
  DrafterConfig cfg;
  cfg.gamma = 6;
  cfg.n_layers = 2;
  cfg.markov_rank = 32;
  cfg.seq_head = head;
  cfg.mask_token_id = mask_token;
  cfg.complete_from(target.info());
  if (with_draft_vocab) cfg.draft_vocab = test_draft_vocab(cfg.vocab);
  Drafter drafter = Drafter::init(cfg, 11);
  perturb(drafter.mutable_params(), 99 + static_cast<uint64_t>(head));
  drafter.bind(target);

  // One sequence, its tapped features, three anchors.
  std::mt19937_64 rng(7);
  std::vector<TokenId> seq(48);
  for (auto& t : seq) t = static_cast<TokenId>(rng() % static_cast<uint64_t>(cfg.vocab));
  KVCache kv = target.new_cache(64);
  at::Tensor taps = target.forward_one(kv, seq, Logits::None, TapRequest{cfg.tap_layers, false}).taps;
  const std::vector<int64_t> anchors = {3, 17, 40};
  const int64_t N = 3, G = cfg.gamma, V = cfg.vocab;
  // Logit row of each token id (-1: not proposable).
  std::vector<int64_t> row_of(static_cast<size_t>(V), -1);
  for (int64_t i = 0; i < V; ++i) row_of[static_cast<size_t>(i)] = cfg.draft_vocab.empty() ? i : -1;
  for (size_t i = 0; i < cfg.draft_vocab.size(); ++i) row_of[static_cast<size_t>(cfg.draft_vocab[i])] = static_cast<int64_t>(i);
  const int64_t Vout = cfg.draft_vocab.empty() ? V : static_cast<int64_t>(cfg.draft_vocab.size());

  DrafterGraph graph(cfg, target.embedding(), target.lm_head(), GraphOptions{precision});
  at::Tensor a = at::tensor(anchors, at::kLong);
  at::Tensor prev_greedy = at::empty({N, G}, at::kLong), prev_sample = at::empty({N, G}, at::kLong);
  std::vector<Draft> greedy(N), sampled(N);
  std::vector<at::Tensor> h_ref(N);
  for (int64_t i = 0; i < N; ++i) {
    const int64_t p = anchors[static_cast<size_t>(i)];
    DraftState st;
    drafter.append_context(st, taps.narrow(0, 0, p));
    h_ref[i] = drafter.block_hidden(st, seq[p], static_cast<int>(G)).clone();
    Rng r(5);
    greedy[i] = drafter.draft(st, seq[p], static_cast<int>(G), SamplingParams{0.f, 0, 1.f, 0.f, 1}, r);
    sampled[i] = drafter.draft(st, seq[p], static_cast<int>(G), SamplingParams{1.f, 0, 1.f, 0.f, 1}, r);
    prev_greedy[i][0] = seq[p];
    prev_sample[i][0] = seq[p];
    for (int64_t k = 1; k < G; ++k) {
      prev_greedy[i][k] = greedy[i].tokens[k - 1];
      prev_sample[i][k] = sampled[i].tokens[k - 1];
    }
  }
  ParityErrors err;
  GraphOut og = graph.forward(drafter.params(), taps, a, prev_greedy);
  GraphOut os = graph.forward(drafter.params(), taps, a, prev_sample);
  EXPECT_EQ(og.logits.sizes(), (std::vector<int64_t>{N, G, Vout}));
  EXPECT_EQ(og.conf_logits.sizes(), (std::vector<int64_t>{N, G}));
  at::Tensor ps = at::softmax(os.logits, -1);
  for (int64_t i = 0; i < N; ++i) {
    err.hidden = std::max(err.hidden, (og.hidden[i] - h_ref[i]).abs().max().item<double>());
    for (int64_t k = 0; k < G; ++k) {
      err.conf = std::max(err.conf, std::abs(og.conf_logits[i][k].item<double>() - greedy[i].conf_logits[k]));
      // The greedy token is the graph's argmax up to bf16 near-ties.
      at::Tensor lg = og.logits[i][k];
      const int64_t row = row_of[static_cast<size_t>(greedy[i].tokens[k])];
      EXPECT_GE(row, 0) << "drafted token outside the draft vocabulary";
      if (row < 0) continue;
      err.tie = std::max(err.tie, lg.max().item<double>() - lg[row].item<double>());
      // q over the whole vocabulary: the graph's softmax at its rows' tokens, 0 elsewhere.
      at::Tensor pfull = at::zeros({V}, at::kDouble);
      pfull.index_copy_(0, graph.vocab_ids().defined() ? graph.vocab_ids() : at::arange(V, at::kLong),
                        ps[i][k].to(at::kDouble));
      const at::Tensor qt = at::tensor(dense(sampled[i].q[k], V), at::kDouble);
      err.prob = std::max(err.prob, (pfull - qt).abs().max().item<double>());
    }
  }
  return err;
}

TEST(TrainGraph, MatchesInferencePathForEveryHead) {
  for (SeqHead head : kHeads) {
    for (auto prec : {MatmulPrecision::Float32, MatmulPrecision::BFloat16}) {
      const int mask_token = head == SeqHead::Markov || head == SeqHead::Rnn ? 7 : -1;
      SCOPED_TRACE(to_string(head) + (prec == MatmulPrecision::Float32 ? " fp32" : " bf16"));
      ParityErrors e = check_parity(head, mask_token, prec);
      // The inference path rounds activations to bf16 before each matmul;
      // the bounds are a few bf16 ulps of the O(1) values involved.
      EXPECT_LT(e.hidden, 0.08) << "max |h_graph - h_infer|";
      EXPECT_LT(e.conf, 0.03) << "max |z_graph - z_infer|";
      EXPECT_LT(e.tie, 0.05) << "greedy token's logit below the graph's max";
      EXPECT_LT(e.prob, 0.01) << "max |softmax(logits_graph) - q_infer|";
      std::printf("[parity %-6s %s] hidden %.2e conf %.2e tie %.2e prob %.2e\n", to_string(head).c_str(),
                  prec == MatmulPrecision::Float32 ? "fp32" : "bf16", e.hidden, e.conf, e.tie, e.prob);
    }
  }
}

TEST(TrainGraph, DraftVocabMatchesInferencePath) {
  for (SeqHead head : {SeqHead::Markov, SeqHead::Elman}) {
    SCOPED_TRACE(to_string(head));
    ParityErrors e = check_parity(head, -1, MatmulPrecision::BFloat16, /*with_draft_vocab=*/true);
    EXPECT_LT(e.hidden, 0.08);
    EXPECT_LT(e.conf, 0.03);
    EXPECT_LT(e.tie, 0.05);
    EXPECT_LT(e.prob, 0.01);
  }
}

// With a draft vocabulary the logits are the full-vocabulary logits at its
// columns, for every head and precision, and gradients through them agree.
TEST(TrainGraph, DraftVocabLogitsAreTheFullLogitsAtItsColumns) {
  TargetModel& target = *tiny().model;
  std::mt19937_64 rng(3);
  std::vector<TokenId> seq(40);
  for (auto& t : seq) t = static_cast<TokenId>(rng() % static_cast<uint64_t>(target.info().vocab));
  for (SeqHead head : kHeads) {
    for (auto prec : {MatmulPrecision::Float32, MatmulPrecision::BFloat16}) {
      SCOPED_TRACE(to_string(head) + (prec == MatmulPrecision::Float32 ? " fp32" : " bf16"));
      DrafterConfig cfg;
      cfg.gamma = 5;
      cfg.seq_head = head;
      cfg.complete_from(target.info());
      Drafter drafter = Drafter::init(cfg, 4);
      perturb(drafter.mutable_params(), 31 + static_cast<uint64_t>(head));
      DrafterConfig cfg_dv = cfg;
      cfg_dv.draft_vocab = test_draft_vocab(cfg.vocab);
      DrafterGraph full(cfg, target.embedding(), target.lm_head(), GraphOptions{prec});
      DrafterGraph sub(cfg_dv, target.embedding(), target.lm_head(), GraphOptions{prec});
      const int64_t Vd = static_cast<int64_t>(cfg_dv.draft_vocab.size());
      ASSERT_EQ(sub.out_vocab(), Vd);
      ASSERT_EQ(full.out_vocab(), cfg.vocab);
      ASSERT_FALSE(full.vocab_ids().defined());
      const at::Tensor ids = sub.vocab_ids();
      ASSERT_EQ(ids.sizes(), (std::vector<int64_t>{Vd}));
      EXPECT_EQ(ids[Vd - 1].item<int64_t>(), cfg.vocab - 1);

      KVCache kv = target.new_cache(64);
      at::Tensor taps = target.forward_one(kv, seq, Logits::None, TapRequest{cfg.tap_layers, false}).taps;
      SlotTargets t = make_slot_targets(seq, std::vector<uint8_t>(seq.size(), 1), std::vector<int64_t>{2, 19, 33},
                                        cfg.gamma);
      ParamMap pf, ps;
      for (const auto& [name, p] : drafter.params()) {
        pf[name] = p.clone().requires_grad_(true);
        ps[name] = p.clone().requires_grad_(true);
      }
      GraphOut of = full.forward(pf, taps, t.anchors, t.prev_tokens);
      GraphOut os = sub.forward(ps, taps, t.anchors, t.prev_tokens);
      ASSERT_EQ(os.logits.sizes(), (std::vector<int64_t>{3, cfg.gamma, Vd}));
      at::Tensor cols = of.logits.index_select(2, ids);
      const double scale = cols.abs().max().item<double>();
      EXPECT_LE((os.logits - cols).abs().max().item<double>(), 1e-5 * scale);
      EXPECT_TRUE(at::equal(os.conf_logits, of.conf_logits));
      // The same function of the draft-vocab logits differentiates alike.
      at::Tensor w = at::empty({3, cfg.gamma, Vd}).normal_(0, 1, at::detail::createCPUGenerator(8));
      (os.logits * w).sum().backward();
      (cols * w).sum().backward();
      for (const auto& [name, p] : pf) {
        if (!p.grad().defined()) {
          EXPECT_FALSE(ps.at(name).grad().defined()) << name;
          continue;
        }
        ASSERT_TRUE(ps.at(name).grad().defined()) << name;
        // bf16 products round their outputs (sums over V vs V' terms may
        // round one bf16 ulp apart).
        const double gs = p.grad().abs().max().item<double>();
        const double tol = prec == MatmulPrecision::Float32 ? 1e-4 : 1e-2;
        EXPECT_LE((ps.at(name).grad() - p.grad()).abs().max().item<double>(), tol * gs + 1e-7) << name;
      }
      // Output rows outside the draft vocabulary get no gradient.
      const char* out_name = head == SeqHead::Elman ? "elman.wo" : "markov_w2.weight";
      if (ps.at(out_name).grad().defined()) {
        at::Tensor outside = at::ones({cfg.vocab}, at::kBool).index_fill_(0, ids, false);
        EXPECT_EQ(ps.at(out_name).grad().index_select(0, outside.nonzero().view({-1})).abs().max().item<double>(), 0.0);
      }
    }
  }
}

// The bf16 LM head (inference kernel, fp32 output) and its backward against
// the fp32 product, with a vocabulary that is not a multiple of 32.
TEST(TrainGraph, Bf16HeadForwardAndGradientMatchFp32) {
  TargetModel& target = *tiny().model;
  DrafterConfig cfg;
  cfg.complete_from(target.info());
  ASSERT_NE(cfg.vocab % 32, 0);
  DrafterGraph g16(cfg, target.embedding(), target.lm_head(), GraphOptions{MatmulPrecision::BFloat16});
  DrafterGraph g32(cfg, target.embedding(), target.lm_head(), GraphOptions{MatmulPrecision::Float32});
  at::Generator gen = at::detail::createCPUGenerator(3);
  at::Tensor h = at::empty({2, 5, cfg.hidden}).normal_(0, 1, gen);
  at::Tensor w = at::empty({2, 5, cfg.vocab}).normal_(0, 1, gen);
  at::Tensor h16 = h.clone().requires_grad_(true), h32 = h.clone().requires_grad_(true);
  at::Tensor y16 = g16.lm_head(h16), y32 = g32.lm_head(h32);
  ASSERT_EQ(y16.sizes(), (std::vector<int64_t>{2, 5, cfg.vocab}));
  ASSERT_EQ(y16.scalar_type(), at::kFloat);
  (y16 * w).sum().backward();
  (y32 * w).sum().backward();
  const double ys = y32.abs().max().item<double>(), gs = h32.grad().abs().max().item<double>();
  EXPECT_LT((y16 - y32).abs().max().item<double>(), 0.02 * ys);
  EXPECT_LT((h16.grad() - h32.grad()).abs().max().item<double>(), 0.02 * gs);
}

TEST(TrainGraph, RejectsBadInputs) {
  TargetModel& target = *tiny().model;
  DrafterConfig cfg;
  cfg.complete_from(target.info());
  Drafter drafter = Drafter::init(cfg, 1);
  DrafterGraph graph(cfg, target.embedding(), target.lm_head());
  at::Tensor feats = at::zeros({10, cfg.m() * cfg.hidden});
  at::Tensor prev = at::zeros({1, cfg.gamma}, at::kLong);
  EXPECT_THROW(graph.forward(drafter.params(), feats, at::tensor({11}, at::kLong), prev), InvalidArgument);
  EXPECT_THROW(graph.forward(drafter.params(), feats, at::tensor({3}, at::kLong), prev + cfg.vocab),
               InvalidArgument);
  EXPECT_THROW(graph.forward(drafter.params(), at::zeros({10, 3}), at::tensor({3}, at::kLong), prev),
               InvalidArgument);
  auto missing = drafter.params();
  missing.erase("fc.weight");
  EXPECT_THROW(graph.forward(missing, feats, at::tensor({3}, at::kLong), prev), InvalidArgument);
  EXPECT_THROW(DrafterGraph(cfg, at::zeros({3, 3}), target.lm_head()), InvalidArgument);
}

// ---- gradient check -------------------------------------------------------------

DrafterConfig tiny_config(SeqHead head) {
  DrafterConfig c;
  c.gamma = 4;
  c.n_layers = 1;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.head_dim = 16;
  c.ffn = 64;
  c.markov_rank = 32;
  c.tap_layers = {0, 1};
  c.seq_head = head;
  c.mask_token_id = -1;
  c.hidden = 32;
  c.vocab = 64;
  c.target_id = "test/tiny";
  c.validate();
  return c;
}

// Central finite differences of the loss in double precision against the
// autograd gradient, 3 entries of every parameter. With a draft vocabulary
// the targets are the restricted target distribution and the labels are
// mapped (some lie outside it), and the output matrices are probed in the
// draft vocabulary's rows.
void check_loss_gradient(SeqHead head, bool with_draft_vocab) {
  DrafterConfig cfg = tiny_config(head);
  const int64_t d = cfg.hidden, V = cfg.vocab, L = 14;
  if (with_draft_vocab) {
    for (TokenId v = 0; v < V; ++v)
      if (v % 5 == 0 || v % 7 == 3) cfg.draft_vocab.push_back(v);
  }
  Drafter init = Drafter::init(cfg, 3);
  auto fparams = init.params();
  perturb(fparams, 17 + static_cast<uint64_t>(head));
  ParamMap params;
  for (auto& [name, p] : fparams) params[name] = p.to(at::kDouble).requires_grad_(true);

  at::Generator g = at::detail::createCPUGenerator(5);
  at::Tensor embed = at::empty({V, d}, at::kDouble).normal_(0, 0.5, g);
  at::Tensor head_w = at::empty({V, d}, at::kDouble).normal_(0, 0.3, g);
  at::Tensor feats = at::empty({L, cfg.m() * d}, at::kDouble).normal_(0, 1, g);
  at::Tensor final_hidden = at::empty({L, d}, at::kDouble).normal_(0, 1, g);
  std::mt19937_64 rng(9);
  std::vector<TokenId> tokens(L);
  for (auto& t : tokens) t = static_cast<TokenId>(rng() % static_cast<uint64_t>(V));
  std::vector<uint8_t> mask(L, 1);
  mask[0] = mask[1] = 0;
  mask[9] = 0;
  const std::vector<int64_t> anchors = {2, 5, 10};
  SlotTargets t = make_slot_targets(tokens, mask, anchors, cfg.gamma, cfg.draft_vocab);
  DrafterGraph graph(cfg, embed, head_w, GraphOptions{MatmulPrecision::Float32});
  at::Tensor pt;
  if (with_draft_vocab) {
    // Both kinds of slots occur: labels inside and outside the draft vocabulary.
    ASSERT_GT((t.draft_labels >= 0).sum().item<int64_t>(), 0);
    ASSERT_GT(((t.draft_labels < 0).logical_and(t.valid)).sum().item<int64_t>(), 0);
    TargetLogitStats st = target_logit_stats(final_hidden, head_w, 0.0, MatmulPrecision::Float32);
    pt = target_probs_sub(final_hidden, graph.head_rows(), st.lse, t.target_pos, 0.0, MatmulPrecision::Float32);
  } else {
    pt = target_probs(final_hidden, head_w, t.target_pos, 0.0, MatmulPrecision::Float32);
  }
  ASSERT_EQ(pt.scalar_type(), at::kDouble);
  LossOptions opts;

  GraphOut out = graph.forward(params, feats, t.anchors, t.prev_tokens);
  ASSERT_EQ(out.logits.scalar_type(), at::kDouble);
  LossTerms l0 = dspark_loss(out, pt, t, opts);
  const at::Tensor c_star = l0.c_star;  // held fixed: the label carries no gradient
  ASSERT_GT(l0.bce, 0.0);
  ASSERT_GT(l0.l1, 0.0);
  l0.total.backward();

  auto f = [&]() {
    c10::NoGradGuard ng;
    GraphOut o = graph.forward(params, feats, t.anchors, t.prev_tokens);
    return dspark_loss(o, pt, t, opts, 0.0, c_star).total.item<double>();
  };
  const double h = 1e-6;
  int checked = 0;
  for (const auto& [name, shape] : Drafter::param_spec(cfg)) {
    at::Tensor p = params.at(name);
    // Only the Markov projection is unused, by the heads that do not read it.
    const bool unused = name == "markov_w2.weight" && (head == SeqHead::None || head == SeqHead::Elman);
    ASSERT_EQ(p.grad().defined(), !unused) << name;
    at::Tensor flat = p.detach().view({-1});
    at::Tensor grad = unused ? at::zeros_like(flat) : p.grad().view({-1});
    std::vector<int64_t> idx;
    if (name == "markov_w1.weight") {
      // Rows of W1 that the teacher-forced tokens use.
      for (int64_t k : {0, 1, 2}) idx.push_back(t.prev_tokens[k][k].item<int64_t>() * cfg.markov_rank + 3 * k);
    } else if (with_draft_vocab && (name == "markov_w2.weight" || name == "elman.wo")) {
      // Output rows of draft-vocabulary tokens (the others get no gradient).
      for (int64_t k : {0, 1, 2})
        idx.push_back(static_cast<int64_t>(cfg.draft_vocab[static_cast<size_t>(4 * k + 1)]) * cfg.markov_rank + 5 * k);
    } else {
      for (int k = 0; k < 3; ++k) idx.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(flat.numel())));
    }
    for (int64_t j : idx) {
      const double orig = flat[j].item<double>();
      flat[j] = orig + h;
      const double fp = f();
      flat[j] = orig - h;
      const double fm = f();
      flat[j] = orig;
      const double fd = (fp - fm) / (2 * h);
      const double an = grad[j].item<double>();
      EXPECT_NEAR(an, fd, 1e-6 + 1e-5 * std::abs(fd)) << name << "[" << j << "]";
      ++checked;
    }
  }
  EXPECT_EQ(checked, 3 * static_cast<int>(Drafter::param_spec(cfg).size()));
}

TEST(TrainGraph, LossGradientMatchesFiniteDifferences) {
  for (SeqHead head : kHeads) {
    SCOPED_TRACE(to_string(head));
    check_loss_gradient(head, false);
  }
}

TEST(TrainGraph, DraftVocabLossGradientMatchesFiniteDifferences) {
  for (SeqHead head : kHeads) {
    SCOPED_TRACE(to_string(head));
    check_loss_gradient(head, true);
  }
}

}  // namespace
