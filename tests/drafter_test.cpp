// The DSpark drafter (dspark-method.md §1-3): seeded init (shared parameters
// identical for every head type, zero-initialized head outputs), parameter
// and config validation, the context K/V cache (chunked appends equal one
// appending everything at once), the sequential and confidence heads
// recomputed from their definitions, sampling drafts, and prune_length.
//
// Runs on a tiny random Llama target; nothing here needs the real model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "dspark/error.hpp"
#include "dspark/speculative/drafter.hpp"
#include "dspark/speculative/speculative.hpp"
#include "spec_test_util.hpp"

namespace {

using namespace dspark;

DrafterConfig tiny_config(SeqHead head, int gamma = 5) {
  return spectest::small_config(spectest::tiny_target().info(), head, gamma);
}

// Target features (taps of the drafter's layers) of `n` tokens.
at::Tensor tiny_features(const DraftModel& d, int64_t n, uint32_t seed = 1) {
  TargetModel& t = spectest::tiny_target();
  std::vector<TokenId> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back(static_cast<TokenId>((seed * 7919u + i * 31u) % 262u));
  KVCache c = t.new_cache();
  return t.forward_one(c, ids, Logits::None, TapRequest{d.tap_layers(), false}).taps;
}

float max_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<float>(); }

// ---- init -----------------------------------------------------------------------------

TEST(DrafterInit, SharedParametersIdenticalAcrossHeads) {
  for (int mask : {-1, 5}) {
    std::map<SeqHead, Drafter> ds;
    for (SeqHead h : spectest::all_heads()) {
      DrafterConfig c = tiny_config(h);
      c.n_layers = 2;
      c.mask_token_id = mask;
      ds.emplace(h, Drafter::init(c, 99));
    }
    const auto& none = ds.at(SeqHead::None).params();
    for (const auto& [ha, da] : ds) {
      // Every head holds every parameter of the head-less drafter.
      for (const auto& [name, t] : none) EXPECT_TRUE(da.params().count(name)) << to_string(ha) << " " << name;
      for (const auto& [hb, db] : ds) {
        if (ha >= hb) continue;
        int shared = 0;
        for (const auto& [name, t] : da.params()) {
          auto it = db.params().find(name);
          if (it == db.params().end()) continue;
          ++shared;
          EXPECT_TRUE(at::equal(t, it->second))
              << name << " differs between " << to_string(ha) << " and " << to_string(hb) << " (mask " << mask << ")";
        }
        EXPECT_GE(shared, static_cast<int>(none.size()));
      }
    }
  }
}

TEST(DrafterInit, ParameterSetIsTheRegistry) {
  for (SeqHead h : spectest::all_heads()) {
    const DrafterConfig c = tiny_config(h);
    const Drafter d = Drafter::init(c, 3);
    const auto spec = Drafter::param_spec(c);
    ASSERT_EQ(d.params().size(), spec.size()) << to_string(h);
    for (const auto& [name, shape] : spec) {
      ASSERT_TRUE(d.params().count(name)) << name;
      EXPECT_EQ(d.params().at(name).sizes().vec(), shape) << name;
      EXPECT_EQ(d.params().at(name).scalar_type(), at::kFloat) << name;
    }
  }
  // Head-specific parameters come after every shared one in the registry.
  const auto spec = Drafter::param_spec(tiny_config(SeqHead::Elman));
  const auto none = Drafter::param_spec(tiny_config(SeqHead::None));
  for (size_t i = 0; i < none.size(); ++i) EXPECT_EQ(spec[i].first, none[i].first);
}

TEST(DrafterInit, DeterministicForASeed) {
  const DrafterConfig c = tiny_config(SeqHead::Rnn);
  const Drafter a = Drafter::init(c, 11), b = Drafter::init(c, 11), other = Drafter::init(c, 12);
  for (const auto& [name, t] : a.params()) EXPECT_TRUE(at::equal(t, b.params().at(name))) << name;
  EXPECT_FALSE(at::equal(a.params().at("fc.weight"), other.params().at("fc.weight")));
}

TEST(DrafterInit, HeadOutputsStartAtZero) {
  for (SeqHead h : spectest::all_heads()) {
    const Drafter d = Drafter::init(tiny_config(h), 5);
    const auto& p = d.params();
    EXPECT_EQ(p.at("markov_w2.weight").abs().max().item<float>(), 0.f) << to_string(h);
    EXPECT_EQ(p.at("conf_proj.bias").abs().max().item<float>(), 0.f);
    if (h == SeqHead::Elman) {
      EXPECT_EQ(p.at("elman.wo").abs().max().item<float>(), 0.f);
    }
    EXPECT_TRUE(at::equal(p.at("output_norm.weight"), at::ones({64})));
    EXPECT_GT(p.at("markov_w1.weight").abs().max().item<float>(), 0.f);
  }
}

TEST(DrafterInit, FreshHeadsDraftExactlyLikeNoHead) {
  // With W2 = 0 and elman.wo = 0 every sequential head adds nothing, so a
  // fresh drafter of any head type drafts what the head-less one drafts.
  TargetModel& t = spectest::tiny_target();
  std::map<SeqHead, Draft> drafts;
  for (SeqHead h : spectest::all_heads()) {
    Drafter d = Drafter::init(tiny_config(h, 6), 21);
    d.bind(t);
    DraftState st;
    d.append_context(st, tiny_features(d, 9));
    SamplingParams greedy;
    greedy.temperature = 0;
    Rng rng(1);
    drafts.emplace(h, d.draft(st, 42, 6, greedy, rng));
  }
  const Draft& ref = drafts.at(SeqHead::None);
  for (const auto& [h, dr] : drafts) {
    EXPECT_EQ(dr.tokens, ref.tokens) << to_string(h);
    EXPECT_EQ(dr.conf_logits, ref.conf_logits) << to_string(h);
  }
}

TEST(DrafterInit, PerturbedHeadsChangeDrafts) {
  TargetModel& t = spectest::tiny_target();
  std::map<SeqHead, std::vector<TokenId>> tokens;
  for (SeqHead h : spectest::all_heads()) {
    Drafter d = spectest::perturbed_drafter(tiny_config(h, 6), 21);
    d.bind(t);
    DraftState st;
    d.append_context(st, tiny_features(d, 9));
    SamplingParams greedy;
    greedy.temperature = 0;
    Rng rng(1);
    for (TokenId anchor : {3, 42, 100, 200}) {
      const Draft dr = d.draft(st, anchor, 6, greedy, rng);
      tokens[h].insert(tokens[h].end(), dr.tokens.begin(), dr.tokens.end());
    }
  }
  for (SeqHead h : spectest::all_heads()) {
    if (h != SeqHead::None) {
      EXPECT_NE(tokens[h], tokens[SeqHead::None]) << to_string(h);
    }
  }
}

// ---- validation ---------------------------------------------------------------------

TEST(DrafterParams, ConstructorRefusesBadParameterSets) {
  const DrafterConfig c = tiny_config(SeqHead::Gated);
  const auto good = Drafter::init(c, 1).params();
  auto expect_error = [&](std::map<std::string, at::Tensor> p, const std::vector<std::string>& parts) {
    try {
      Drafter d(c, std::move(p));
      ADD_FAILURE() << "accepted; expected an error mentioning " << parts.front();
    } catch (const FormatError& e) {
      for (const auto& s : parts) EXPECT_NE(std::string(e.what()).find(s), std::string::npos) << e.what();
    }
  };
  auto missing = good;
  missing.erase("markov_gate.bias");
  expect_error(missing, {"missing", "markov_gate.bias"});
  auto shape = good;
  shape["layers.0.attn_q.weight"] = at::zeros({64, 32});
  expect_error(shape, {"layers.0.attn_q.weight", "[64, 32]", "[64, 64]"});
  auto extra = good;
  extra["rnn.weight"] = at::zeros({96, 128});
  expect_error(extra, {"unexpected", "rnn.weight", "gated"});
  // bf16 tensors are accepted and kept as fp32 masters.
  auto half = good;
  for (auto& [n, t] : half) t = t.to(at::kBFloat16);
  Drafter d(c, half);
  EXPECT_EQ(d.params().at("fc.weight").scalar_type(), at::kFloat);
}

TEST(DrafterParams, ConfigValidation) {
  const TargetInfo& info = spectest::tiny_target().info();
  auto refused = [&](auto mutate, const std::string& part) {
    DrafterConfig c;
    c.markov_rank = 32;
    mutate(c);
    try {
      c.complete_from(info);
      ADD_FAILURE() << "accepted; expected " << part;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  refused([](DrafterConfig& c) { c.gamma = 0; }, "gamma");
  refused([](DrafterConfig& c) { c.gamma = kMaxGamma + 1; }, "gamma");
  refused([](DrafterConfig& c) { c.markov_rank = 48; }, "markov_rank");
  refused([](DrafterConfig& c) { c.tap_layers = {0, 2}; }, "tap layer 2");
  refused([](DrafterConfig& c) { c.mask_token_id = 262; }, "mask_token_id");
  EXPECT_THROW(parse_seq_head("lstm"), InvalidArgument);
  for (SeqHead h : spectest::all_heads()) EXPECT_EQ(parse_seq_head(to_string(h)), h);
  // The default taps: one layer for a two-layer target, never the last.
  DrafterConfig c;
  c.complete_from(info);
  EXPECT_EQ(c.tap_layers, std::vector<int>{1});
}

TEST(DrafterParams, BindRefusesAnotherTargetsDims) {
  DrafterConfig c = tiny_config(SeqHead::Markov);
  c.vocab = 300;
  Drafter d = Drafter::init(c, 1);
  try {
    d.bind(spectest::tiny_target());
    ADD_FAILURE() << "bind accepted a vocabulary mismatch";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("300"), std::string::npos) << m;
    EXPECT_NE(m.find("262"), std::string::npos) << m;
  }
  // Unbound drafters refuse to run.
  DraftState st;
  EXPECT_THROW(d.append_context(st, at::zeros({1, 64})), InvalidArgument);
}

// ---- the context K/V cache ------------------------------------------------------------

void expect_same_state(const DraftState& a, const DraftState& b, const std::string& what) {
  ASSERT_EQ(a.n_ctx, b.n_ctx) << what;
  ASSERT_EQ(a.k.size(), b.k.size()) << what;
  for (size_t l = 0; l < a.k.size(); ++l) {
    EXPECT_TRUE(at::equal(a.k[l].narrow(1, 0, a.n_ctx), b.k[l].narrow(1, 0, b.n_ctx))) << what << " K layer " << l;
    EXPECT_TRUE(at::equal(a.v[l].narrow(1, 0, a.n_ctx), b.v[l].narrow(1, 0, b.n_ctx))) << what << " V layer " << l;
  }
}

TEST(DrafterContext, ChunkedAppendEqualsOneShot) {
  TargetModel& t = spectest::tiny_target();
  DrafterConfig c = tiny_config(SeqHead::Rnn, 7);
  c.n_layers = 2;
  Drafter d = spectest::perturbed_drafter(c, 8);
  d.bind(t);
  const at::Tensor feats = tiny_features(d, 40);
  DraftState one, chunked;
  d.append_context(one, feats);
  const std::vector<int64_t> cuts = {0, 1, 4, 11, 23, 24, 40};
  for (size_t i = 0; i + 1 < cuts.size(); ++i)
    d.append_context(chunked, feats.narrow(0, cuts[i], cuts[i + 1] - cuts[i]));
  expect_same_state(one, chunked, "40 target rows");
  for (TokenId anchor : {0, 17, 261}) {
    for (int g : {1, 7, 12}) {
      const at::Tensor a = d.block_hidden(one, anchor, g), b = d.block_hidden(chunked, anchor, g);
      ASSERT_EQ(a.sizes().vec(), (std::vector<int64_t>{g, 64}));
      EXPECT_LE(max_diff(a, b), 1e-6f) << "anchor " << anchor << " gamma " << g;
    }
    SamplingParams greedy;
    greedy.temperature = 0;
    Rng r1(1), r2(1);
    const Draft x = d.draft(one, anchor, 7, greedy, r1), y = d.draft(chunked, anchor, 7, greedy, r2);
    EXPECT_EQ(x.tokens, y.tokens);
    EXPECT_EQ(x.conf_logits, y.conf_logits);
  }
  // An empty append changes nothing.
  d.append_context(chunked, feats.narrow(0, 0, 0));
  EXPECT_EQ(chunked.n_ctx, 40);
}

TEST(DrafterContext, GrowthPastInitialCapacity) {
  TargetModel& t = spectest::tiny_target();
  Drafter d = spectest::perturbed_drafter(tiny_config(SeqHead::Markov, 5), 9);
  d.bind(t);
  at::Generator gen = at::detail::createCPUGenerator(4);
  const at::Tensor feats = at::empty({600, 64}, at::kFloat).normal_(0.0, 1.0, gen);
  DraftState one, chunked;
  d.append_context(one, feats);
  for (int64_t i = 0; i < 600; i += 37) d.append_context(chunked, feats.narrow(0, i, std::min<int64_t>(37, 600 - i)));
  expect_same_state(one, chunked, "600 random rows");
  EXPECT_LE(max_diff(d.block_hidden(one, 5, 5), d.block_hidden(chunked, 5, 5)), 1e-6f);
}

TEST(DrafterContext, RefusesBadInput) {
  TargetModel& t = spectest::tiny_target();
  Drafter d = Drafter::init(tiny_config(SeqHead::None), 1);
  d.bind(t);
  DraftState st;
  EXPECT_THROW(d.block_hidden(st, 1, 3), InvalidArgument);  // no context yet
  EXPECT_THROW(d.append_context(st, at::zeros({3, 128})), InvalidArgument);
  d.append_context(st, at::zeros({3, 64}));
  EXPECT_THROW(d.block_hidden(st, 1, kMaxGamma + 1), InvalidArgument);
  SamplingParams greedy;
  greedy.temperature = 0;
  Rng rng(1);
  EXPECT_THROW(d.draft(st, 262, 3, greedy, rng), InvalidArgument);
  // gamma 0 drafts the configured block size.
  EXPECT_EQ(d.draft(st, 1, 0, greedy, rng).tokens.size(), 5u);
}

// ---- heads, recomputed from their definitions ------------------------------------------

// U_k = LMHead(h_k) in fp32 from bf16-rounded h (the kernel's inputs).
at::Tensor head_logits(const at::Tensor& h, const TargetModel& t) {
  at::Tensor hb = h.to(at::kBFloat16).to(at::kFloat);
  return at::matmul(hb, t.lm_head().to(at::kFloat).t());
}

TEST(DrafterHeads, MarkovHeadUsesThePreviousToken) {
  // logits_k = U_k + W2·W1[x_{k-1}] with x_{-1} = the anchor; the drafted
  // token is (up to accumulation-order rounding) the argmax, and
  // z_k = w·[h_k; W1[x_{k-1}]] + b.
  TargetModel& t = spectest::tiny_target();
  Drafter d = spectest::perturbed_drafter(tiny_config(SeqHead::Markov, 6), 13);
  d.mutable_params()["conf_proj.bias"].fill_(0.25);
  d.bind(t);
  DraftState st;
  d.append_context(st, tiny_features(d, 12));
  const TokenId anchor = 77;
  const at::Tensor h = d.block_hidden(st, anchor, 6);
  const at::Tensor U = head_logits(h, t);
  SamplingParams greedy;
  greedy.temperature = 0;
  Rng rng(1);
  const Draft dr = d.draft(st, anchor, 6, greedy, rng);
  const at::Tensor W1 = d.params().at("markov_w1.weight").to(at::kBFloat16).to(at::kFloat);
  const at::Tensor W2 = d.params().at("markov_w2.weight").to(at::kBFloat16).to(at::kFloat);
  const at::Tensor cw = d.params().at("conf_proj.weight")[0];
  TokenId prev = anchor;
  for (int k = 0; k < 6; ++k) {
    const at::Tensor e = W1[prev];
    const at::Tensor logits = U[k] + at::matmul(W2, e);
    const float best = logits.max().item<float>();
    const float got = logits[dr.tokens[static_cast<size_t>(k)]].item<float>();
    EXPECT_GE(got, best - 1e-3f * (1.f + std::fabs(best))) << "slot " << k;
    const float z = (at::dot(cw.narrow(0, 0, 64), h[k]) + at::dot(cw.narrow(0, 64, 32), e)).item<float>() + 0.25f;
    EXPECT_NEAR(dr.conf_logits[static_cast<size_t>(k)], z, 1e-4f) << "slot " << k;
    prev = dr.tokens[static_cast<size_t>(k)];
  }
}

TEST(DrafterHeads, NoHeadDraftsTheBackboneArgmax) {
  TargetModel& t = spectest::tiny_target();
  Drafter d = spectest::perturbed_drafter(tiny_config(SeqHead::None, 8), 14);
  d.bind(t);
  DraftState st;
  d.append_context(st, tiny_features(d, 5));
  const at::Tensor U = head_logits(d.block_hidden(st, 9, 8), t);
  SamplingParams greedy;
  greedy.temperature = 0;
  Rng rng(1);
  const Draft dr = d.draft(st, 9, 8, greedy, rng);
  for (int k = 0; k < 8; ++k) {
    const float best = U[k].max().item<float>();
    EXPECT_GE(U[k][dr.tokens[static_cast<size_t>(k)]].item<float>(), best - 1e-3f * (1.f + std::fabs(best)));
  }
}

TEST(DrafterHeads, SamplingDraftsComeFromTheirDistributions) {
  TargetModel& t = spectest::tiny_target();
  for (SeqHead h : spectest::all_heads()) {
    Drafter d = spectest::perturbed_drafter(tiny_config(h, 6), 15);
    d.bind(t);
    DraftState st;
    d.append_context(st, tiny_features(d, 7));
    SamplingParams sp;
    sp.temperature = 1.0f;
    sp.top_k = 10;
    Rng rng(3);
    const Draft dr = d.draft(st, 30, 6, sp, rng);
    ASSERT_EQ(dr.q.size(), 6u) << to_string(h);
    ASSERT_EQ(dr.tokens.size(), 6u);
    ASSERT_EQ(dr.conf_logits.size(), 6u);
    for (size_t k = 0; k < 6; ++k) {
      EXPECT_GT(dr.q[k].prob(dr.tokens[k]), 0.f) << to_string(h) << " slot " << k;
      EXPECT_LE(dr.q[k].size(), 10u);
      double sum = 0;
      for (float p : dr.q[k].probs) sum += p;
      EXPECT_NEAR(sum, 1.0, 1e-5);
    }
    // Greedy drafts carry no distributions.
    SamplingParams greedy;
    greedy.temperature = 0;
    EXPECT_TRUE(d.draft(st, 30, 6, greedy, rng).q.empty());
  }
}

// ---- draft vocabulary -----------------------------------------------------------------

// Every other token id below V, plus `extra` (ascending, deduplicated).
std::vector<TokenId> half_vocab(int64_t V, std::vector<TokenId> extra = {}) {
  std::vector<TokenId> v;
  for (TokenId t = 0; t < V; t += 2) v.push_back(t);
  v.insert(v.end(), extra.begin(), extra.end());
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

TEST(DrafterDraftVocab, GreedyDraftsAreTheArgmaxInsideTheVocabulary) {
  // With a draft vocabulary the drafted token is the argmax of the full
  // head's logits restricted to it; the confidences are unchanged.
  TargetModel& t = spectest::tiny_target();
  for (SeqHead h : spectest::all_heads()) {
    DrafterConfig cfg = tiny_config(h, 6);
    Drafter full = spectest::perturbed_drafter(cfg, 21);
    cfg.draft_vocab = half_vocab(cfg.vocab);
    Drafter part(cfg, full.params());
    full.bind(t);
    part.bind(t);
    DraftState st_full, st_part;
    full.append_context(st_full, tiny_features(full, 9));
    part.append_context(st_part, tiny_features(part, 9));
    SamplingParams greedy;
    greedy.temperature = 0;
    Rng rng(1);
    const Draft a = full.draft(st_full, 40, 6, greedy, rng);
    const Draft b = part.draft(st_part, 40, 6, greedy, rng);
    ASSERT_EQ(b.tokens.size(), 6u);
    for (size_t k = 0; k < 6; ++k) {
      EXPECT_EQ(b.tokens[k] % 2, 0) << to_string(h) << " slot " << k << ": token outside the vocabulary";
      // The slot-0 logits do not depend on earlier drafts: if the full
      // argmax is in the vocabulary, it is also the restricted argmax.
      if (k == 0 && a.tokens[0] % 2 == 0) {
        EXPECT_EQ(a.tokens[0], b.tokens[0]) << to_string(h);
      }
    }
    EXPECT_EQ(b.conf_logits[0], a.conf_logits[0]) << to_string(h);
  }
}

TEST(DrafterDraftVocab, SameDraftsWhenTheVocabularyHoldsThem) {
  // A vocabulary holding every token the full drafter proposes (plus half of
  // the rest) changes nothing: same tokens, same confidences, and under
  // sampling the same distributions restricted and renormalized to it.
  TargetModel& t = spectest::tiny_target();
  DrafterConfig cfg = tiny_config(SeqHead::Markov, 6);
  Drafter full = spectest::perturbed_drafter(cfg, 22);
  full.bind(t);
  DraftState st;
  full.append_context(st, tiny_features(full, 11));
  SamplingParams greedy;
  greedy.temperature = 0;
  Rng rng(1);
  const Draft a = full.draft(st, 12, 6, greedy, rng);
  cfg.draft_vocab = half_vocab(cfg.vocab, a.tokens);
  Drafter part(cfg, full.params());
  part.bind(t);
  DraftState st2;
  part.append_context(st2, tiny_features(part, 11));
  const Draft b = part.draft(st2, 12, 6, greedy, rng);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.conf_logits, b.conf_logits);

  // Sampling with top-k 0, top-p 1, min-p 0: q_k over the vocabulary is the
  // full softmax restricted to it and renormalized.
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.top_k = 0;
  sp.top_p = 1.0f;
  sp.min_p = 0.0f;
  Rng r1(5), r2(5);
  const Draft fs = full.draft(st, 12, 1, sp, r1);
  const Draft ps = part.draft(st2, 12, 1, sp, r2);
  ASSERT_EQ(ps.q.size(), 1u);
  const Distribution& qf = fs.q[0];
  const Distribution& qp = ps.q[0];
  EXPECT_EQ(qp.size(), cfg.draft_vocab.size());
  double mass = 0;
  for (TokenId id : cfg.draft_vocab) mass += qf.prob(id);
  double sum = 0;
  for (size_t i = 0; i < qp.size(); ++i) {
    EXPECT_TRUE(std::binary_search(cfg.draft_vocab.begin(), cfg.draft_vocab.end(), qp.ids[i]));
    EXPECT_NEAR(qp.probs[i], qf.prob(qp.ids[i]) / mass, 1e-5) << "token " << qp.ids[i];
    if (i > 0) {
      EXPECT_GE(qp.probs[i - 1], qp.probs[i]);  // order kept after mapping
    }
    sum += qp.probs[i];
  }
  EXPECT_NEAR(sum, 1.0, 1e-5);
  EXPECT_GT(qp.prob(ps.tokens[0]), 0.f);
}

TEST(DrafterDraftVocab, ConfigRefusesBadVocabularies) {
  DrafterConfig cfg = tiny_config(SeqHead::Markov);
  cfg.draft_vocab = {3, 2};
  EXPECT_THROW(cfg.validate(), InvalidArgument);
  cfg.draft_vocab = {2, 2};
  EXPECT_THROW(cfg.validate(), InvalidArgument);
  cfg.draft_vocab = {0, static_cast<TokenId>(cfg.vocab)};
  EXPECT_THROW(cfg.validate(), InvalidArgument);
  cfg.draft_vocab = {-1, 4};
  EXPECT_THROW(cfg.validate(), InvalidArgument);
  cfg.draft_vocab = {0, 5, static_cast<TokenId>(cfg.vocab - 1)};
  EXPECT_NO_THROW(cfg.validate());
}

// ---- prune_length ---------------------------------------------------------------------

float logit(double c) { return static_cast<float>(std::log(c / (1 - c))); }

TEST(DrafterPrune, PositionZeroIsAlwaysKept) {
  EXPECT_EQ(prune_length({-20.f, 20.f, 20.f}, {0.99, 0.0, 0.0}), 3);
  EXPECT_EQ(prune_length({-20.f, -20.f}, {0.99, 0.99}), 1);
  EXPECT_EQ(prune_length({-20.f}, {1.0}), 1);
}

TEST(DrafterPrune, FirstFailingPositionCuts) {
  const std::vector<float> z = {logit(0.9), logit(0.8), logit(0.3), logit(0.9), logit(0.1)};
  EXPECT_EQ(prune_length(z, std::vector<double>(5, 0.5)), 2);
  EXPECT_EQ(prune_length(z, {0.5, 0.85, 0.0, 0.0, 0.0}), 1);
  EXPECT_EQ(prune_length(z, {0.0, 0.0, 0.0, 0.0, 0.2}), 4);
  EXPECT_EQ(prune_length(z, {0.0, 0.0, 0.2, 0.95, 0.0}), 3);  // the later failure does not matter
  // A confidence equal to its threshold is kept (only c < threshold cuts).
  EXPECT_EQ(prune_length({0.f, 0.f, 0.f}, {0.5, 0.5, 0.5}), 3);
}

TEST(DrafterPrune, EmptyThresholdsKeepAll) {
  EXPECT_EQ(prune_length({-9.f, -9.f, -9.f, -9.f}, {}), 4);
  EXPECT_EQ(prune_length({}, {}), 0);
  EXPECT_EQ(prune_length({}, {0.5}), 0);
}

TEST(DrafterPrune, ThresholdsShorterThanTheBlock) {
  const std::vector<float> z = {0.f, logit(0.7), -9.f, -9.f, -9.f};
  EXPECT_EQ(prune_length(z, {0.0, 0.5}), 5);  // positions past the list are kept
  EXPECT_EQ(prune_length(z, {0.0, 0.5, 0.1}), 2);
  EXPECT_EQ(prune_length(z, {0.0, 0.75}), 1);
}

}  // namespace
