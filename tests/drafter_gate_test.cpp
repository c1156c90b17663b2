// The drafter-skip rule (drafter_gate.hpp): hand-computed estimates and the
// exact rounds at which a drafter that never pays still explores.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "dspark/speculative/drafter_gate.hpp"

using dspark::DrafterGate;

namespace {
// A flat-then-linear curve: a plain step 10 ms, each extra verified token
// +2 ms (SPS(b) = 1 / (0.010 + 0.002 (b - 1))).
std::vector<double> linear_sps(int bmax) {
  std::vector<double> s;
  for (int b = 1; b <= bmax; ++b) s.push_back(1.0 / (0.010 + 0.002 * (b - 1)));
  return s;
}

// Drives the gate for `rounds` rounds, recording `verified`/`accepted` and
// `draft_s` for every drafting round (its verify untimed, so the curve
// prices it) and a 10 ms plain step for every other; returns the indices
// that drafted.
std::vector<int> drive(DrafterGate& g, int rounds, int64_t verified, int64_t accepted, double draft_s) {
  std::vector<int> drafted;
  for (int r = 0; r < rounds; ++r) {
    if (g.should_draft()) {
      drafted.push_back(r);
      g.record(verified, accepted, draft_s);
    } else {
      g.record_plain(0.010);  // the curve's plain step
    }
  }
  return drafted;
}
}  // namespace

TEST(DrafterGate, WithoutACurveEveryRoundDrafts) {
  DrafterGate g;
  EXPECT_EQ(drive(g, 50, 8, 0, 1.0).size(), 50u);
}

TEST(DrafterGate, EstimateMatchesHandComputation) {
  // 4 rounds of 4 verified, 2 accepted, 1 ms drafting: a round emits 3
  // tokens in t(5) + 1 ms = 18 + 1 = 19 ms, 158 tok/s > 100 steps/s: pays.
  DrafterGate g(linear_sps(16));
  for (int i = 0; i < 4; ++i) g.record(4, 2, 0.001);
  EXPECT_TRUE(g.pays());
  // The same with 10 ms of drafting: 3 tokens in 28 ms = 107 tok/s, pays;
  // with 12 ms: 3 / 30 ms = 100 tok/s, not more than a plain step: no.
  DrafterGate g10(linear_sps(16)), g12(linear_sps(16));
  for (int i = 0; i < 4; ++i) g10.record(4, 2, 0.010), g12.record(4, 2, 0.012);
  EXPECT_TRUE(g10.pays());
  EXPECT_FALSE(g12.pays());
  // 8 verified, 1 accepted, 0.5 ms: 2 tokens in 26.5 ms = 75 tok/s: no.
  DrafterGate g8(linear_sps(16));
  for (int i = 0; i < 4; ++i) g8.record(8, 1, 0.0005);
  EXPECT_FALSE(g8.pays());
  EXPECT_FALSE(DrafterGate(linear_sps(4)).pays());  // no rounds yet
}

TEST(DrafterGate, ADrafterThatNeverPaysExploresWithBackoff) {
  // Every round verifies 8 and accepts none: never pays. Rounds 0-3 warm
  // up; then one exploration after 8, 16, 32, 64, 64, ... skipped rounds.
  DrafterGate g(linear_sps(16));
  const std::vector<int> drafted = drive(g, 400, 8, 0, 0.001);
  std::vector<int> expect = {0, 1, 2, 3};
  int at = 3;
  for (int gap : {8, 16, 32, 64, 64, 64, 64, 64})
    if ((at += gap) < 400) expect.push_back(at);
  EXPECT_EQ(drafted, expect);
  EXPECT_EQ(g.period(), DrafterGate::kExploreMax);
}

TEST(DrafterGate, ADrafterThatPaysAlwaysDraftsAndRecovers) {
  DrafterGate g(linear_sps(16));
  // Every round but the 4 skipped to time plain steps (rounds 19, 35, 51, 67).
  EXPECT_EQ(drive(g, 100, 4, 3, 0.001).size(), 96u);
  // A bad stretch: rounds drafting 8 and accepting 0 pull the mean down
  // until it no longer pays; the gate then explores with a growing period.
  DrafterGate h(linear_sps(16));
  drive(h, 10, 4, 3, 0.001);
  const auto bad = drive(h, 200, 8, 0, 0.001);
  ASSERT_LT(bad.size(), 200u);
  EXPECT_FALSE(h.pays());
  EXPECT_GT(h.period(), DrafterGate::kExploreMin);
  // Good rounds again: the first exploration that brings the mean back
  // above a plain step resets the period, and every round drafts again.
  while (!h.pays()) drive(h, 1, 7, 7, 0.0);
  EXPECT_TRUE(h.should_draft());
  EXPECT_EQ(h.period(), DrafterGate::kExploreMin);
}

// ---- memory across sequences ---------------------------------------------------------------

TEST(DrafterGateMemory, ASequenceAfterOneWhereTheDrafterNeverPaidSkipsTheWarmUp) {
  auto memory = std::make_shared<dspark::DrafterGateMemory>();
  DrafterGate first(linear_sps(16), memory, /*sampled=*/true);
  drive(first, 200, 8, 0, 0.001);  // warm-up, then explorations up to the longest period
  ASSERT_EQ(first.period(), DrafterGate::kExploreMax);
  // The next sequence starts from the memory: no warm-up, and its first
  // exploration comes after the period the first one reached.
  DrafterGate second(linear_sps(16), memory, true);
  EXPECT_FALSE(second.pays());
  EXPECT_EQ(drive(second, 200, 8, 0, 0.001), (std::vector<int>{63, 127, 191}));
  // The other regime learned nothing: a greedy sequence warms up.
  DrafterGate greedy(linear_sps(16), memory, false);
  EXPECT_EQ(drive(greedy, 4, 8, 0, 0.001).size(), 4u);
}

TEST(DrafterGateMemory, ADrafterThatPaidDraftsFromTheFirstRoundAndOwnRoundsTakeOver) {
  auto memory = std::make_shared<dspark::DrafterGateMemory>();
  DrafterGate first(linear_sps(16), memory);
  drive(first, 50, 4, 3, 0.001);
  DrafterGate second(linear_sps(16), memory);
  EXPECT_TRUE(second.pays());  // before any round of its own
  // This text is different: rounds that accept nothing outweigh the
  // memory's kPriorRounds pseudo-rounds. After 8: 1 + 24/16 = 2.5 tokens in
  // t(7) + 1 ms = 23 ms, 109 tok/s > 100, still pays; after 12: 2.2 tokens
  // in 23 ms, 96 tok/s: no.
  for (int i = 0; i < 8; ++i) second.record(8, 0, 0.001);
  EXPECT_TRUE(second.pays());
  for (int i = 0; i < 4; ++i) second.record(8, 0, 0.001);
  EXPECT_FALSE(second.pays());
}

TEST(DrafterGateMemory, SumsDecayToTheRecentRounds) {
  dspark::DrafterGateMemory m;
  for (int i = 0; i < 1000; ++i) m.record(false, 4, i < 900 ? 0 : 4, 0.002, 0.01);
  const auto s = m.get(false);
  EXPECT_LE(s.rounds, dspark::DrafterGateMemory::kMemoryRounds);
  EXPECT_GT(s.rounds, dspark::DrafterGateMemory::kMemoryRounds / 2);
  // The 900 rounds that accepted nothing have all but faded: 100 rounds
  // later they weigh less than 2^-3 of the sums.
  EXPECT_GT(s.accepted, 3.5 * s.rounds);
  EXPECT_LT(s.accepted, 4.0 * s.rounds);
  EXPECT_EQ(m.get(true).rounds, 0);
}

// ---- measured round times ------------------------------------------------------------------

TEST(DrafterGate, MeasuredTimesOverruleTheCurve) {
  // The curve says a plain step is 10 ms and a verify of 5 tokens 18 ms: 4
  // verified, 2 accepted, 1 ms drafting pays (3 tokens in 19 ms, 158 tok/s
  // > 100). Measured on this machine the verify took 24 ms and a plain step
  // 7 ms: 3 tokens in 25 ms = 120 tok/s < 143: it does not.
  DrafterGate g(linear_sps(16));
  for (int i = 0; i < 4; ++i) g.record(4, 2, 0.001, 0.024);
  EXPECT_TRUE(g.pays());  // no plain step timed yet: the curve decides
  for (int i = 0; i < 3; ++i) g.record_plain(0.007);
  EXPECT_TRUE(g.pays());  // still fewer than kMinPlain
  g.record_plain(0.007);
  EXPECT_FALSE(g.pays());
  // A plain step of 9 ms: 120 > 111 tok/s, it pays.
  DrafterGate h(linear_sps(16));
  for (int i = 0; i < 4; ++i) h.record(4, 2, 0.001, 0.024), h.record_plain(0.009);
  EXPECT_TRUE(h.pays());
}

TEST(DrafterGate, APayingDrafterSkipsARoundNowAndThenToTimeAPlainStep) {
  DrafterGate g(linear_sps(16));
  std::vector<int> skipped;
  for (int r = 0; r < 100; ++r) {
    if (g.should_draft()) g.record(4, 3, 0.001, 0.012);
    else skipped.push_back(r), g.record_plain(0.010);
  }
  // Rounds 0-3 warm up; from round 4 every 16th paying round is skipped
  // until kMinPlain plain steps are timed; then the drafter always drafts.
  EXPECT_EQ(skipped, (std::vector<int>{19, 35, 51, 67}));
}

TEST(DrafterGateMemory, PlainStepsCarryOverToTheNextSequence) {
  auto memory = std::make_shared<dspark::DrafterGateMemory>();
  DrafterGate first(linear_sps(16), memory);
  for (int i = 0; i < 6; ++i) first.record(4, 2, 0.001, 0.024), first.record_plain(0.007);
  EXPECT_FALSE(first.pays());
  // A new sequence prices its first rounds on the memory's timings too.
  DrafterGate second(linear_sps(16), memory);
  EXPECT_FALSE(second.pays());
  EXPECT_FALSE(second.should_draft());
}
