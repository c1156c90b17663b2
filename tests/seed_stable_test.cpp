// Seed-stable sampling (dspark-method.md §5, Gumbel-max coupling) and the
// batch runner's chunked prefill: the counter-based generator against the
// Random123 known-answer vectors; the Gumbel-max draw is an exact sample of
// its distribution (chi-square goodness of fit); speculative decoding under
// the seed-stable rule emits the plain-sampled tokens exactly, whatever γ,
// pruning, scheduling and drafter; chunked prefill never changes a token.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "dspark/speculative/runner.hpp"
#include "dspark/speculative/seed_stable.hpp"
#include "spec_test_util.hpp"

namespace {

using namespace dspark;
using dspark::spectest::OracleDrafter;

TEST(SeedStable, PhiloxKnownAnswers) {
  // Random123's kat_vectors for philox4x32_10.
  using W = std::array<uint32_t, 4>;
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}), (W{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(philox4x32_10({~0u, ~0u, ~0u, ~0u}, {~0u, ~0u}), (W{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
            (W{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(SeedStable, NoiseIsAFunctionOfSeedPositionAndToken) {
  const double u = noise_uniform(7, 100, 42);
  EXPECT_EQ(u, noise_uniform(7, 100, 42));
  EXPECT_NE(u, noise_uniform(8, 100, 42));
  EXPECT_NE(u, noise_uniform(7, 101, 42));
  EXPECT_NE(u, noise_uniform(7, 100, 43));
  EXPECT_NE(noise_uniform(7, int64_t{1} << 32, 42), noise_uniform(7, 0, 42));  // high position bits count
  // Uniform on (0, 1): mean 1/2, variance 1/12, never an endpoint.
  double sum = 0, sq = 0;
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    const double v = noise_uniform(3, i, i % 7);
    ASSERT_GT(v, 0.0);
    ASSERT_LT(v, 1.0);
    sum += v;
    sq += v * v;
  }
  EXPECT_NEAR(sum / n, 0.5, 0.005);
  EXPECT_NEAR(sq / n - (sum / n) * (sum / n), 1.0 / 12, 0.002);
  EXPECT_DOUBLE_EQ(gumbel_noise(7, 100, 42), -std::log(-std::log(u)));
}

Distribution dist(std::vector<std::pair<TokenId, float>> items) {
  Distribution d;
  for (auto [id, p] : items) {
    d.ids.push_back(id);
    d.probs.push_back(p);
  }
  return d;
}

// Pearson goodness of fit of counts to probabilities; returns the p-value
// (Wilson–Hilferty normal approximation of the chi-square tail).
double fit_p_value(const std::map<TokenId, int64_t>& counts, const Distribution& d, int64_t n) {
  double stat = 0;
  for (size_t i = 0; i < d.ids.size(); ++i) {
    const double e = n * static_cast<double>(d.probs[i]);
    const double o = counts.count(d.ids[i]) ? static_cast<double>(counts.at(d.ids[i])) : 0.0;
    stat += (o - e) * (o - e) / e;
  }
  const double k = static_cast<double>(d.ids.size() - 1);
  const double z = (std::cbrt(stat / k) - (1 - 2 / (9 * k))) / std::sqrt(2 / (9 * k));
  return 0.5 * std::erfc(z / std::sqrt(2.0));
}

TEST(SeedStable, GumbelArgmaxIsAnExactSample) {
  const Distribution d = dist({{5, 0.4f}, {9, 0.25f}, {2, 0.15f}, {30, 0.1f}, {7, 0.07f}, {11, 0.03f}});
  const int64_t n = 60000;
  std::map<TokenId, int64_t> counts;
  for (int64_t pos = 0; pos < n; ++pos) ++counts[gumbel_argmax(d, 12345, pos)];
  const double p = fit_p_value(counts, d, n);
  EXPECT_GT(p, 0.001) << "Gumbel-max draws do not follow the distribution";
  // The same draws tested against a distribution 2% away are rejected.
  const Distribution off = dist({{5, 0.38f}, {9, 0.27f}, {2, 0.15f}, {30, 0.1f}, {7, 0.07f}, {11, 0.03f}});
  EXPECT_LT(fit_p_value(counts, off, n), 1e-6);
  // Zero-probability entries never win; an empty distribution is an error.
  const Distribution with_zero = dist({{1, 0.f}, {2, 1.f}});
  for (int64_t pos = 0; pos < 200; ++pos) EXPECT_EQ(gumbel_argmax(with_zero, 1, pos), 2);
  EXPECT_THROW(gumbel_argmax(Distribution{}, 1, 0), InvalidArgument);
}

TEST(SeedStable, DrawFollowsTheRule) {
  const Distribution d = dist({{5, 0.5f}, {9, 0.5f}});
  SamplingParams sp;
  sp.seed = 77;
  sp.rule = SamplingRule::SeedStable;
  Rng a(1), b(1);
  EXPECT_EQ(draw(d, sp, a, 10), gumbel_argmax(d, 77, 10));
  EXPECT_EQ(a.uniform(), b.uniform());  // the stream was not touched
  sp.rule = SamplingRule::Rejection;
  Rng c(1), e(1);
  EXPECT_EQ(draw(d, sp, c, 10), sample(d, e));
}

// ---- the real model ----------------------------------------------------------------

GenerateOptions seeded(int64_t n, uint64_t seed, const std::vector<TokenId>& stop_ids) {
  GenerateOptions o;
  o.n_predict = n;
  o.sampling.temperature = 0.8f;
  o.sampling.seed = seed;
  o.sampling.rule = SamplingRule::SeedStable;
  o.stop_ids = stop_ids;
  return o;
}

TEST(SeedStable, SpeculativeEqualsPlainForEveryGammaAndSchedule) {
  DSPARK_REAL_MODEL(lm);
  TargetModel& target = *lm.target;
  const Drafter drafter = spectest::random_drafter(target, SeqHead::Markov);
  std::vector<double> sps;  // a falling curve: the scheduler cuts windows
  for (int b = 1; b <= 16; ++b) sps.push_back(100.0 / (1.0 + 0.15 * b));
  // Every γ 1..8 and verify mode; the default run alternates the drafters
  // and uses two prompts, DSPARK_TEST_FULL=1 runs both drafters on four
  // prompts and two seeds.
  const bool full = spectest::full_mode();
  int64_t accepted = 0, drafted = 0;
  for (size_t i : spectest::spread_prompts(full ? 4 : 2)) {
    const auto& prompt = spectest::dev_prompt_ids(i);
    for (uint64_t seed : full ? std::vector<uint64_t>{11, 12} : std::vector<uint64_t>{11}) {
      const GenerateOptions o = seeded(24, seed, lm.stop_ids);
      const GenerateResult plain = generate_plain(target, prompt, o);
      // The target's own continuation as a noisy oracle: real acceptance.
      OracleDrafter oracle(OracleDrafter::Kind::Noisy, plain.tokens, static_cast<int64_t>(prompt.size()),
                           target.info().vocab, 0.3, seed);
      for (int g = 1; g <= 8; ++g) {
        for (int mode = 0; mode < 3; ++mode) {
          SpecOptions so;
          so.gamma = g;
          so.prune = mode == 1;
          if (mode == 1) so.min_conf = 0.5;
          if (mode == 2) so.sps = sps;
          for (const DraftModel* d : {static_cast<const DraftModel*>(&drafter), static_cast<const DraftModel*>(&oracle)}) {
            if (!full && (d == &oracle) != ((g + mode) % 2 == 1)) continue;
            const GenerateResult sp = generate_speculative(target, *d, prompt, o, so);
            ASSERT_EQ(spectest::compare_runs(plain, sp), "")
                << "prompt " << i << " seed " << seed << " gamma " << g << " mode " << mode;
            accepted += sp.stats.accepted;
            drafted += sp.stats.drafted;
          }
        }
      }
    }
  }
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, drafted);
}

TEST(SeedStable, SeedChangesTheText) {
  DSPARK_REAL_MODEL(lm);
  const auto& prompt = spectest::dev_prompt_ids(0);
  std::set<std::vector<TokenId>> texts;
  for (uint64_t seed = 0; seed < 4; ++seed) texts.insert(generate_plain(*lm.target, prompt, seeded(16, seed, {})).tokens);
  EXPECT_EQ(texts.size(), 4u);
}

TEST(ChunkedPrefill, CostModel) {
  TargetInfo t;
  t.hidden = 576;
  t.n_heads = 9;
  t.n_kv_heads = 3;
  t.head_dim = 64;
  t.ffn = 1536;
  // SmolLM2-135M: 3,538,944 multiply-adds of weights per token and layer,
  // 1,152 of attention per context position, at a third of the rate.
  EXPECT_EQ(prefill_attention_span(t), 3538944 / (1152 * kAttentionSlowdown));
  EXPECT_EQ(prefill_attention_span(t), 1024);
  EXPECT_DOUBLE_EQ(prefill_cost(1, 0, 1024), 1.0);
  EXPECT_DOUBLE_EQ(prefill_cost(4, 1024, 1024), 4 + (4 * 1024 + 6) / 1024.0);
  EXPECT_DOUBLE_EQ(prefill_cost(0, 100, 3072), 0.0);
}

// Runs sessions together through one runner with a prefill budget.
std::vector<GenerateResult> run_together(TargetModel& target, const DraftModel* drafter,
                                         const std::vector<std::vector<TokenId>>& prompts, const GenerateOptions& o,
                                         int64_t budget, int64_t* calls) {
  std::vector<std::unique_ptr<SpecSession>> sessions;
  std::vector<SpecSession*> ptrs;
  SpecOptions so;
  so.gamma = 4;
  for (const auto& p : prompts) {
    sessions.push_back(std::make_unique<SpecSession>(target, drafter, p, o, so));
    ptrs.push_back(sessions.back().get());
  }
  BatchRunner runner(target, drafter, so, RunnerOptions{budget});
  auto live = [&] {
    for (auto* s : ptrs)
      if (!s->finished()) return true;
    return false;
  };
  while (live()) runner.step(ptrs);
  *calls = runner.calls();
  std::vector<GenerateResult> out;
  for (auto* s : ptrs) out.push_back(s->result());
  return out;
}

TEST(ChunkedPrefill, ChunksNeverChangeTokens) {
  DSPARK_REAL_MODEL(lm);
  TargetModel& target = *lm.target;
  const Drafter drafter = spectest::random_drafter(target, SeqHead::Markov);
  std::vector<std::vector<TokenId>> prompts;
  std::vector<TokenId> longer;
  for (size_t i : spectest::spread_prompts(3)) {
    prompts.push_back(spectest::dev_prompt_ids(i));
    longer.insert(longer.end(), prompts.back().begin(), prompts.back().end());
  }
  prompts.push_back(longer);  // a prompt several chunks long
  for (const bool sampled : {false, true}) {
    GenerateOptions o = seeded(8, 5, lm.stop_ids);
    if (!sampled) o.sampling.temperature = 0;
    // Greedy plain and seed-stable speculative (each covers its rule).
    for (const DraftModel* d : {sampled ? static_cast<const DraftModel*>(&drafter) : nullptr}) {
      int64_t whole_calls = 0, chunked_calls = 0;
      const auto whole = run_together(target, d, prompts, o, 0, &whole_calls);
      const auto chunked = run_together(target, d, prompts, o, 48, &chunked_calls);
      for (size_t i = 0; i < prompts.size(); ++i) {
        EXPECT_EQ(spectest::compare_runs(whole[i], chunked[i]), "") << "prompt " << i << " sampled " << sampled;
        // Alone, too: batching and chunking change nothing.
        SpecOptions so;
        so.gamma = 4;
        const GenerateResult alone = d ? generate_speculative(target, *d, prompts[i], o, so)
                                       : generate_plain(target, prompts[i], o);
        EXPECT_EQ(spectest::compare_runs(alone, chunked[i]), "") << "prompt " << i << " alone";
      }
      // The long prompt needed several calls of at most 48 row equivalents.
      EXPECT_GT(chunked_calls, whole_calls + static_cast<int64_t>(longer.size()) / 48 - 1);
    }
  }
}

}  // namespace
