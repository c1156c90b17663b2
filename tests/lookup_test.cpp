// Prompt-lookup drafts: the matcher on hand-computed histories, and
// losslessness on the real model — alone, mixed with a drafter, batched, and
// seed-stable under sampling (the chi-square test of the rejection rule with
// one-hot lookup drafts is in speculative_test.cpp).
#include <gtest/gtest.h>

#include <sstream>
#include <vector>

#include "dspark/error.hpp"
#include "dspark/speculative/drafter_gate.hpp"
#include "dspark/speculative/lookup.hpp"
#include "dspark/speculative/runner.hpp"
#include "dspark/speculative/session.hpp"
#include "spec_test_util.hpp"

namespace dspark {
namespace {

using V = std::vector<TokenId>;

TEST(LookupDraft, MostRecentOccurrenceAndItsContinuation) {
  // "1 2" last occurred ending at index 2: the draft is what followed it.
  EXPECT_EQ(lookup_draft(V{1, 2, 3, 4, 1, 2}, 2, 4, 2), (V{3, 4}));
  // The most recent of two earlier occurrences wins.
  EXPECT_EQ(lookup_draft(V{1, 2, 5, 1, 2, 6, 1, 2}, 2, 2, 1), (V{6}));
}

TEST(LookupDraft, LongestSuffixFirst) {
  // n = 3 ("7 1 2") matches at the start and proposes 8; n = 2 alone would
  // take the more recent "1 2" and propose 9.
  const V h{7, 1, 2, 8, 5, 1, 2, 9, 7, 1, 2};
  EXPECT_EQ(lookup_draft(h, 2, 3, 1), (V{8}));
  EXPECT_EQ(lookup_draft(h, 2, 2, 1), (V{9}));
}

TEST(LookupDraft, ContinuationPastTheEndRepeatsTheLoop) {
  // Match "1 2" ending at 2; the continuation 3 4 1 2 then runs into its own
  // proposals: a loop of period 4.
  EXPECT_EQ(lookup_draft(V{1, 2, 3, 4, 1, 2}, 2, 4, 7), (V{3, 4, 1, 2, 3, 4, 1}));
  // A run of one token continues as that token.
  EXPECT_EQ(lookup_draft(V{9, 4, 4, 4}, 2, 2, 5), (V{4, 4, 4, 4, 4}));
}

TEST(LookupDraft, NoMatchGivesNoDraft) {
  EXPECT_TRUE(lookup_draft(V{1, 2, 3, 4}, 1, 4, 4).empty());      // no token repeats
  EXPECT_TRUE(lookup_draft(V{1, 2, 3, 1}, 2, 4, 4).empty());      // only a 1-gram repeats
  EXPECT_EQ(lookup_draft(V{1, 2, 3, 1}, 1, 4, 2), (V{2, 3}));     // ... which min_ngram 1 takes
  EXPECT_TRUE(lookup_draft(V{1, 2, 3, 1}, 0, 4, 2).empty());      // off
  EXPECT_TRUE(lookup_draft(V{1, 2}, 2, 4, 2).empty());            // too short to hold an earlier match
  EXPECT_TRUE(lookup_draft(V{}, 1, 4, 2).empty());
  EXPECT_TRUE(lookup_draft(V{1, 2, 1, 2}, 2, 4, 0).empty());      // no room
}

TEST(LookupDraft, OptionsAreValidated) {
  LookupOptions o;
  EXPECT_NO_THROW(o.validate());  // off
  o.min_ngram = 3;
  o.max_ngram = 2;
  EXPECT_THROW(o.validate(), InvalidArgument);
  o.max_ngram = 4;
  o.max_draft = 0;
  EXPECT_THROW(o.validate(), InvalidArgument);
  o.max_draft = kMaxGamma + 1;
  EXPECT_THROW(o.validate(), InvalidArgument);
  o.max_draft = kMaxGamma;
  EXPECT_NO_THROW(o.validate());
}

SpecOptions lookup_spec(int min_ngram, int max_draft, int gamma = 0) {
  SpecOptions s;
  s.gamma = gamma;
  s.prune = false;
  s.lookup.min_ngram = min_ngram;
  s.lookup.max_ngram = std::max(min_ngram, 4);
  s.lookup.max_draft = max_draft;
  return s;
}

GenerateResult run(TargetModel& target, const DraftModel* drafter, const std::vector<TokenId>& prompt,
                   const GenerateOptions& opts, const SpecOptions& spec) {
  SpecSession s(target, drafter, prompt, opts, spec);
  return run_session(target, drafter, s, spec);
}

// Greedy: lookup drafts alone and mixed with a random drafter give plain
// decoding's tokens on every prompt, for several draft lengths and n-gram
// sizes; the lookup rounds really happen and are partly accepted.
TEST(LookupSpec, GreedyOutputEqualsPlain) {
  DSPARK_REAL_MODEL(lm);
  TargetModel& target = *lm.target;
  const Drafter drafter = spectest::random_drafter(target, SeqHead::Markov);
  const int64_t n = spectest::full_mode() ? 96 : 48;
  const auto prompts = spectest::spread_prompts(spectest::full_mode() ? 40 : 6);
  int64_t lookup_rounds = 0, lookup_drafted = 0, lookup_accepted = 0, drafter_rounds = 0, cases = 0;
  std::ostringstream fails;
  for (size_t pi = 0; pi < prompts.size(); ++pi) {
    const size_t p = prompts[pi];
    const auto& plain = spectest::plain_greedy(p, n, lm.stop_ids);
    for (const DraftModel* d : {static_cast<const DraftModel*>(nullptr), static_cast<const DraftModel*>(&drafter)}) {
      const int min_ngram = 1 + static_cast<int>(pi % 3);
      const int max_draft = pi % 2 == 0 ? 16 : 5;
      const GenerateResult r = run(target, d, spectest::dev_prompt_ids(p), spectest::greedy_options(n, lm.stop_ids),
                                   lookup_spec(min_ngram, max_draft, d ? 4 : 0));
      ++cases;
      if (const std::string diff = spectest::compare_runs(plain, r); !diff.empty())
        fails << "\n  prompt " << p << (d ? " drafter+lookup" : " lookup") << " n-gram " << min_ngram << ": " << diff;
      if (r.stats.target_calls != r.stats.rounds) fails << "\n  prompt " << p << ": calls != rounds";
      lookup_rounds += r.stats.lookup_rounds;
      lookup_drafted += r.stats.lookup_drafted;
      lookup_accepted += r.stats.lookup_accepted;
      if (d) drafter_rounds += r.stats.rounds - r.stats.lookup_rounds;
    }
  }
  EXPECT_TRUE(fails.str().empty()) << fails.str();
  EXPECT_GT(lookup_rounds, 0);
  EXPECT_GT(lookup_accepted, 0);
  EXPECT_LT(lookup_accepted, lookup_drafted);
  EXPECT_GT(drafter_rounds, 0) << "the drafter never drafted next to lookup";
  std::cout << "[ lookup ] " << cases << " runs, " << lookup_rounds << " lookup rounds, " << lookup_accepted << "/"
            << lookup_drafted << " accepted\n";
}

// A text that repeats: lookup drafts are long and mostly accepted, so each
// target call emits several tokens.
TEST(LookupSpec, RepetitiveTextIsDraftedByLookup) {
  DSPARK_REAL_MODEL(lm);
  TargetModel& target = *lm.target;
  const auto prompt = lm.encode_prompt(
      "Repeat the list exactly five times.\nalpha, beta, gamma, delta, epsilon, zeta, eta, theta\n"
      "alpha, beta, gamma, delta, epsilon, zeta, eta, theta\n",
      false);
  const GenerateOptions o = spectest::greedy_options(64, lm.stop_ids);
  const GenerateResult plain = generate_plain(target, prompt, o);
  const GenerateResult r = run(target, nullptr, prompt, o, lookup_spec(2, 16));
  EXPECT_EQ(r.tokens, plain.tokens) << spectest::compare_runs(plain, r);
  EXPECT_GT(r.stats.tau(), 2.0) << "lookup τ on repeated text: " << r.stats.tau() << " over "
                                << r.stats.target_calls << " calls for " << r.tokens.size() << " tokens";
}

// Several sessions batched by one runner (as the server batches requests),
// on the SPS schedule: each equals its own plain run.
TEST(LookupSpec, BatchedSessionsWithSchedulerEqualPlain) {
  DSPARK_REAL_MODEL(lm);
  TargetModel& target = *lm.target;
  const Drafter drafter = spectest::random_drafter(target, SeqHead::Markov);
  const int64_t n = 40;
  SpecOptions spec = lookup_spec(2, 12, 4);
  // A cost curve on which a few verified tokens pay: SPS(B) falls slowly with B.
  for (int b = 1; b <= 64; ++b) spec.sps.push_back(100.0 / (1.0 + 0.08 * (b - 1)));
  const auto prompts = spectest::spread_prompts(4);
  std::vector<SpecSession> sessions;
  for (size_t p : prompts)
    sessions.emplace_back(target, &drafter, spectest::dev_prompt_ids(p), spectest::greedy_options(n, lm.stop_ids), spec);
  std::vector<SpecSession*> ptrs;
  for (auto& s : sessions) ptrs.push_back(&s);
  BatchRunner runner(target, &drafter, spec);
  int64_t steps = 0;
  auto all_done = [&] { return std::all_of(ptrs.begin(), ptrs.end(), [](SpecSession* s) { return s->finished(); }); };
  while (!all_done() && steps < 10 * n) {
    runner.step(ptrs);
    ++steps;
  }
  int64_t lookup_rounds = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto& plain = spectest::plain_greedy(prompts[i], n, lm.stop_ids);
    EXPECT_EQ(sessions[i].result().tokens, plain.tokens) << "prompt " << prompts[i] << ": "
                                                         << spectest::compare_runs(plain, sessions[i].result());
    lookup_rounds += sessions[i].result().stats.lookup_rounds;
  }
  EXPECT_GT(lookup_rounds, 0);
}

// On a cost curve where verifying drafts never pays, a drafter whose rounds
// emit one token each stops drafting after its first rounds (exploring after
// 8, 16, 32 skipped rounds: drafter_gate.hpp), and the output stays plain
// decoding's.
TEST(LookupSpec, DrafterThatDoesNotPayMostlyStopsDrafting) {
  DSPARK_REAL_MODEL(lm);
  TargetModel& target = *lm.target;
  const size_t p = spectest::spread_prompts(4)[1];
  const int64_t n = 64;
  const auto reference = spectest::reference_continuation(p, n + 8);
  const auto& prompt = spectest::dev_prompt_ids(p);
  spectest::OracleDrafter wrong(spectest::OracleDrafter::Kind::Wrong, reference, static_cast<int64_t>(prompt.size()),
                                target.info().vocab, 0.0, 1);
  spectest::RecordingDrafter rec(wrong, {});
  // Once plain steps are timed the rule compares measured round times: a
  // drafter that costs many plain steps keeps that comparison clear of timing
  // noise (a cheap one made a verify of 5 now and then look cheaper than the
  // plain steps' mean, and drafted once more).
  rec.delay = std::chrono::milliseconds(50);
  SpecOptions spec;
  spec.gamma = 4;
  spec.prune = false;
  spec.sps = {100, 99, 98, 97, 96};  // drafts cost nothing to verify; the wrong drafter still emits 1 token a round
  const GenerateResult r = run(target, &rec, prompt, spectest::greedy_options(n, lm.stop_ids), spec);
  const auto& plain = spectest::plain_greedy(p, n, lm.stop_ids);
  EXPECT_EQ(r.tokens, plain.tokens) << spectest::compare_runs(plain, r);
  EXPECT_EQ(r.stats.accepted, 0);
  // 4 warm-up rounds, then explorations at rounds 11, 27 and 59 of ~63.
  EXPECT_GE(rec.passes, DrafterGate::kWarmup + 2);
  EXPECT_LE(rec.passes, DrafterGate::kWarmup + 3) << "drafting passes for " << r.tokens.size() << " tokens";
  // Without a curve nothing is skipped.
  spectest::RecordingDrafter all(wrong, {});
  SpecOptions off = spec;
  off.sps.clear();
  const GenerateResult r2 = run(target, &all, prompt, spectest::greedy_options(n, lm.stop_ids), off);
  EXPECT_EQ(r2.tokens, plain.tokens);
  EXPECT_GE(all.passes, static_cast<int64_t>(r2.tokens.size()) - 1);  // every round but the prefill's token
}

// Seed-stable sampling: the tokens are the plain-sampled ones of the seed
// whatever drafts lookup adds, for several draft lengths.
TEST(LookupSpec, SeedStableSamplingEqualsPlainForTheSeed) {
  DSPARK_REAL_MODEL(lm);
  TargetModel& target = *lm.target;
  const Drafter drafter = spectest::random_drafter(target, SeqHead::Markov);
  int64_t lookup_rounds = 0;
  for (size_t p : spectest::spread_prompts(3)) {
    for (uint64_t seed : {11u, 12u}) {
      GenerateOptions o = spectest::greedy_options(40, lm.stop_ids);
      o.sampling.temperature = 0.8f;
      o.sampling.seed = seed;
      o.sampling.rule = SamplingRule::SeedStable;
      const GenerateResult plain = generate_plain(target, spectest::dev_prompt_ids(p), o);
      for (int max_draft : {3, 16}) {
        const GenerateResult a = run(target, nullptr, spectest::dev_prompt_ids(p), o, lookup_spec(1, max_draft));
        const GenerateResult b = run(target, &drafter, spectest::dev_prompt_ids(p), o, lookup_spec(2, max_draft, 5));
        EXPECT_EQ(a.tokens, plain.tokens) << "prompt " << p << " seed " << seed << " lookup";
        EXPECT_EQ(b.tokens, plain.tokens) << "prompt " << p << " seed " << seed << " drafter+lookup";
        lookup_rounds += a.stats.lookup_rounds + b.stats.lookup_rounds;
      }
    }
  }
  EXPECT_GT(lookup_rounds, 0);
}

}  // namespace
}  // namespace dspark
