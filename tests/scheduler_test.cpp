// The hardware-aware prefix scheduler (DSpark Alg. 1): SPS lookup and
// extrapolation, early stop (non-anticipation), flat and steep curves, tie
// order, the R = 1 threshold equivalence, SPS profile files, and lossless
// generation under every verify-length schedule.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>

#include "dspark/ops/kernel_level.hpp"
#include "dspark/speculative/calibration.hpp"
#include "dspark/speculative/scheduler.hpp"
#include "dspark/speculative/sps_profile.hpp"
#include "spec_test_util.hpp"

namespace dspark {
namespace {

// Θ of a given set of lengths (for cross-checks).
double theta_of(const std::vector<std::vector<double>>& a, const std::vector<int>& len,
                const std::vector<double>& sps) {
  double tau = static_cast<double>(a.size());
  int64_t B = static_cast<int64_t>(a.size());
  for (size_t r = 0; r < a.size(); ++r)
    for (int j = 0; j < len[r]; ++j) tau += a[r][j], ++B;
  return tau * sps_at(sps, B);
}

TEST(Scheduler, SpsLookupAndExtrapolation) {
  const std::vector<double> sps = {100, 90, 80};
  EXPECT_DOUBLE_EQ(sps_at(sps, 1), 100);
  EXPECT_DOUBLE_EQ(sps_at(sps, 3), 80);
  EXPECT_DOUBLE_EQ(sps_at(sps, 0), 100);  // b < 1 reads as 1
  // Step time past the end grows linearly with the last segment's slope.
  const double t2 = 1 / 90.0, t3 = 1 / 80.0;
  EXPECT_NEAR(1 / sps_at(sps, 5), t3 + 2 * (t3 - t2), 1e-12);
  EXPECT_LT(sps_at(sps, 10), sps_at(sps, 5));
  // A curve rising at its end is extended flat, never upwards.
  EXPECT_DOUBLE_EQ(sps_at({50, 60}, 9), 60);
  // A one-point curve is extended as a constant.
  EXPECT_DOUBLE_EQ(sps_at({42}, 100), 42);
  EXPECT_THROW(sps_at({}, 1), InvalidArgument);
  EXPECT_THROW(sps_at({1, 0}, 1), InvalidArgument);
  EXPECT_THROW(sps_at({1, NAN}, 1), InvalidArgument);
}

TEST(Scheduler, FlatSpsAdmitsEveryPositiveCandidate) {
  const std::vector<double> flat(64, 10.0);
  const std::vector<std::vector<double>> a = {{0.9, 0.5, 0.1, 0.01}, {0.3, 0.2}, {}, {1e-6}};
  const ScheduleResult r = schedule_prefixes(a, flat);
  EXPECT_EQ(r.lengths, (std::vector<int>{4, 2, 0, 1}));
  EXPECT_EQ(r.batch, 4 + 7);
  EXPECT_NEAR(r.tau, 4 + 0.9 + 0.5 + 0.1 + 0.01 + 0.3 + 0.2 + 1e-6, 1e-12);
  EXPECT_NEAR(r.theta, r.tau * 10.0, 1e-9);
  // Zero survival adds nothing to τ, so on a flat curve it is not admitted.
  EXPECT_EQ(schedule_single({0.8, 0.0, 0.0}, flat), 1);
}

TEST(Scheduler, SteepSpsShortensTheWindow) {
  const std::vector<double> a = {0.95, 0.85, 0.7, 0.5, 0.3, 0.15, 0.05};
  std::vector<int> lens;
  for (double slope : {0.0, 0.02, 0.1, 0.3, 1.0, 5.0}) {
    std::vector<double> sps;
    for (int b = 1; b <= 16; ++b) sps.push_back(1.0 / (1.0 + slope * (b - 1)));  // step time linear in B
    lens.push_back(schedule_single(a, sps));
  }
  EXPECT_EQ(lens.front(), 7);
  for (size_t i = 1; i < lens.size(); ++i) EXPECT_LE(lens[i], lens[i - 1]) << "slope index " << i;
  EXPECT_LT(lens.back(), 2);
  // Compute-bound machine (time ∝ B): admit while a > τ / B.
  std::vector<double> prop;
  for (int b = 1; b <= 16; ++b) prop.push_back(1.0 / b);
  // τ/B: 1/1 → 0.95 fails (0.95 < 1). Nothing is admitted.
  EXPECT_EQ(schedule_single(a, prop), 0);
}

// The early stop: Θ falls at the 2nd candidate but would rise above its
// current value if the 3rd and 4th were admitted too. A scheduler that
// looked ahead (or skipped) would verify 4 positions; Alg. 1 must verify 1,
// because whether a position is verified may not depend on later ones.
TEST(Scheduler, NonAnticipationStopsAtFirstNonImprovingCandidate) {
  const std::vector<double> sps = {1.0, 1.0, 0.5, 0.5, 0.5, 0.5};
  const std::vector<double> a = {0.9, 0.85, 0.85, 0.85};
  ASSERT_GT(theta_of({a}, {4}, sps), theta_of({a}, {1}, sps));  // the trap is real
  ASSERT_LT(theta_of({a}, {2}, sps), theta_of({a}, {1}, sps));
  const ScheduleResult r = schedule_prefixes({a}, sps);
  EXPECT_EQ(r.lengths, std::vector<int>{1});
  EXPECT_EQ(r.batch, 2);
  EXPECT_NEAR(r.theta, 1.9, 1e-12);

  // Same across requests: request 1's candidate fails, request 0's later
  // candidates would lift Θ again; none is admitted.
  const std::vector<std::vector<double>> two = {{0.9, 0.44, 0.44, 0.44, 0.44, 0.44}, {0.45}};
  const std::vector<double> sps2 = {1.0, 1.0, 1.0, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6};
  const ScheduleResult r2 = schedule_prefixes(two, sps2);
  // B = 2, τ = 2 → admit 0.9 (B 3, τ 2.9, Θ 2.9) → 0.45 at B 4: 3.35·0.6 = 2.01 < 2.9: stop.
  EXPECT_EQ(r2.lengths, (std::vector<int>{1, 0}));
  EXPECT_NEAR(r2.theta, 2.9, 1e-12);
  ASSERT_GT(theta_of(two, {6, 1}, sps2), r2.theta);  // 5.55 · 0.6 = 3.33: the trap is real
}

TEST(Scheduler, AnyDraftCanPayMatchesTheFirstCandidateRule) {
  // Flat curve: one more token is free, so a draft always can pay.
  const std::vector<double> flat(16, 100.0);
  for (int64_t R = 1; R <= 8; ++R) EXPECT_TRUE(any_draft_can_pay(R, flat)) << R;
  // SPS(B) = 100 / B: (R + 1) · 100/(R + 1) = 100 = R · 100/R, never a gain.
  std::vector<double> inverse;
  for (int b = 1; b <= 16; ++b) inverse.push_back(100.0 / b);
  for (int64_t R = 1; R <= 8; ++R) EXPECT_FALSE(any_draft_can_pay(R, inverse)) << R;
  // This machine's measured shape (steps/s at B = 1..9): drafting pays at
  // low load and not at 8 requests: 9 · 43.1 = 387.9 < 8 · 51.1 = 408.8.
  const std::vector<double> measured = {108.2, 84.2, 78.3, 72.2, 59.7, 56.4, 53.4, 51.1, 43.1};
  EXPECT_TRUE(any_draft_can_pay(1, measured));   // 2 · 84.2 > 108.2
  EXPECT_TRUE(any_draft_can_pay(2, measured));   // 3 · 78.3 > 2 · 84.2
  EXPECT_FALSE(any_draft_can_pay(8, measured));
  EXPECT_FALSE(any_draft_can_pay(0, measured));
  // Consistent with schedule_prefixes: when it says false, a perfect draft
  // (survival 1 everywhere) is still not admitted.
  const std::vector<std::vector<double>> perfect(8, std::vector<double>(4, 1.0));
  const ScheduleResult r = schedule_prefixes(perfect, measured);
  for (int l : r.lengths) EXPECT_EQ(l, 0);
  EXPECT_THROW(any_draft_can_pay(2, {}), InvalidArgument);
}

TEST(Scheduler, TiesTakeSmallerPositionThenSmallerRequest) {
  // Three tied candidates (0,1), (1,1), (0,2); the curve admits exactly two.
  const std::vector<std::vector<double>> a = {{0.5, 0.5}, {0.5}};
  // B = 2, τ = 2, Θ = 2; B 3: 2.5·0.9 = 2.25 > 2; B 4: 3·0.8 = 2.4 > 2.25; B 5: 3.5·0.6 = 2.1 stop.
  const std::vector<double> sps = {1.0, 1.0, 0.9, 0.8, 0.6};
  EXPECT_EQ(schedule_prefixes(a, sps).lengths, (std::vector<int>{1, 1}));
  // Admitting one: (0,1) wins over (1,1).
  const std::vector<double> one = {1.0, 1.0, 0.9, 0.7};
  EXPECT_EQ(schedule_prefixes(a, one).lengths, (std::vector<int>{1, 0}));
  // Higher survival always goes first regardless of request order.
  EXPECT_EQ(schedule_prefixes({{0.5}, {0.6}}, one).lengths, (std::vector<int>{0, 1}));
}

TEST(Scheduler, AdmittedSetsArePrefixesAndGreedyIsConsistent) {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> U(0.0, 1.0);
  for (int trial = 0; trial < 300; ++trial) {
    const int R = 1 + static_cast<int>(U(rng) * 5);
    std::vector<std::vector<double>> a(R);
    for (auto& s : a) {
      double p = 1.0;
      const int g = static_cast<int>(U(rng) * 9);
      for (int j = 0; j < g; ++j) s.push_back(p *= (trial % 3 == 0 ? 0.5 : U(rng)));
    }
    std::vector<double> sps;
    double t = 1.0;
    for (int b = 1; b <= 40; ++b) sps.push_back(1.0 / (t += U(rng) * 0.3));
    const ScheduleResult r = schedule_prefixes(a, sps);
    ASSERT_EQ(r.lengths.size(), a.size());
    int64_t B = R;
    for (int r_ = 0; r_ < R; ++r_) {
      ASSERT_GE(r.lengths[r_], 0);
      ASSERT_LE(r.lengths[r_], static_cast<int>(a[r_].size()));
      B += r.lengths[r_];
    }
    EXPECT_EQ(r.batch, B);
    EXPECT_NEAR(r.theta, theta_of(a, r.lengths, sps), 1e-9);
    EXPECT_GE(r.theta, R * sps_at(sps, R) - 1e-12);  // never worse than verifying anchors only
  }
}

TEST(Scheduler, RejectsInvalidSurvival) {
  const std::vector<double> sps(8, 1.0);
  EXPECT_THROW(schedule_single({0.5, 0.6}, sps), InvalidArgument);
  EXPECT_THROW(schedule_single({1.5}, sps), InvalidArgument);
  EXPECT_THROW(schedule_single({-0.1}, sps), InvalidArgument);
  EXPECT_THROW(schedule_single({NAN}, sps), InvalidArgument);
  EXPECT_NO_THROW(schedule_single({0.5, 0.5 + 1e-12}, sps));  // rounding noise is tolerated
  const ScheduleResult empty = schedule_prefixes({}, sps);
  EXPECT_TRUE(empty.lengths.empty());
  EXPECT_EQ(empty.batch, 0);
}

// R = 1 is a threshold rule: with h_j = τ_{j-1} · (SPS(j) / SPS(j+1) − 1)
// and τ_{j-1} = 1 + Σ_{i<j} a_i, the scheduler's ℓ equals prune_length on
// calibrated survival with thresholds h (whenever position 1 is admitted,
// which prune_length always keeps).
TEST(Scheduler, SingleRequestEqualsThresholdRule) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> U(0.0, 1.0);
  int checked = 0, cut = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int g = 1 + static_cast<int>(U(rng) * 10);
    std::vector<float> z;
    for (int k = 0; k < g; ++k) z.push_back(static_cast<float>(-1.0 + 7.0 * U(rng)));
    const std::vector<double> a = calibrated_survival(z, {});
    std::vector<double> sps;
    double t = 1.0;
    for (int b = 1; b <= g + 2; ++b) sps.push_back(1.0 / (t += U(rng) * 0.5));
    std::vector<double> h(static_cast<size_t>(g));
    double tau = 1.0;
    for (int j = 1; j <= g; ++j) {
      h[j - 1] = tau * (sps_at(sps, j) / sps_at(sps, j + 1) - 1.0);
      tau += a[j - 1];
    }
    const int ell = schedule_single(a, sps);
    if (a[0] <= h[0]) {
      EXPECT_EQ(ell, 0);
      continue;
    }
    // prune_length cuts when â_k < h_k; the scheduler when a_k <= h_k (no exact ties here).
    EXPECT_EQ(ell, prune_length(z, h, std::vector<double>(g, 1.0))) << "trial " << trial;
    ++checked;
    cut += ell < g;
  }
  EXPECT_GT(checked, 50);
  EXPECT_GT(cut, 10);
}

// ---- prune_length on calibrated survival ----------------------------------------------

TEST(Scheduler, PruneOnCalibratedSurvival) {
  // σ(0) = 0.5: survival 0.5, 0.25, 0.125 (T = 1).
  const std::vector<float> z = {0.f, 0.f, 0.f};
  EXPECT_EQ(prune_length(z, {0.0, 0.3, 0.0}, {1.0, 1.0, 1.0}), 1);
  EXPECT_EQ(prune_length(z, {0.0, 0.2, 0.2}, {1.0, 1.0, 1.0}), 2);
  EXPECT_EQ(prune_length(z, {0.0, 0.2, 0.1}, {1.0}), 3);  // T = 1 past the list
  // Without temperatures: per-position confidence 0.5 each, as before.
  EXPECT_EQ(prune_length(z, {0.0, 0.3, 0.3}, {}), 3);
  // Temperature sharpens: z = 2 with T = 0.5 → σ(4) = 0.982; T = 4 → σ(0.5) = 0.622.
  const std::vector<float> z2 = {2.f, 2.f};
  EXPECT_EQ(prune_length(z2, {0.0, 0.9}, {0.5, 0.5}), 2);
  EXPECT_EQ(prune_length(z2, {0.0, 0.9}, {4.0, 4.0}), 1);
  // Position 0 is always kept.
  EXPECT_EQ(prune_length({-20.f}, {1.0}, {1.0}), 1);
}

// ---- SPS profiles ----------------------------------------------------------------------

TEST(SpsProfile, MeasureSaveLoadRoundTrip) {
  TargetModel& t = spectest::tiny_target();
  SpsProfileOptions o;
  o.bmax = 4;
  o.context = 16;
  o.repetitions = 2;
  o.requests = 2;
  int calls = 0;
  const SpsProfile p = measure_sps(t, o, [&](int b, double sps) {
    EXPECT_EQ(b, ++calls);
    EXPECT_GT(sps, 0);
  });
  EXPECT_EQ(calls, 4);
  EXPECT_EQ(p.b, (std::vector<int>{1, 2, 3, 4}));
  EXPECT_EQ(p.sps.size(), 4u);
  EXPECT_EQ(p.multi_b, (std::vector<int>{2, 3, 4}));
  // keyed by model, compute path and kernel level
  EXPECT_EQ(p.model, t.info().id + "@" + t.info().compute + "@" + dspark::ops::to_string(dspark::ops::active_kernel_level()));
  test::TempDir dir;
  const std::string path = dir.file("sub/profile.json");
  save_sps_profile(path, p);
  const SpsProfile q = load_sps_profile(path);
  EXPECT_EQ(q.sps, p.sps);
  EXPECT_EQ(q.b, p.b);
  EXPECT_EQ(q.multi_sps, p.multi_sps);
  EXPECT_EQ(q.requests, 2);

  o.context = t.info().context;  // no room for the verify tokens
  EXPECT_THROW(measure_sps(t, o), InvalidArgument);
}

TEST(SpsProfile, ErrorsAndDefaultPath) {
  test::TempDir dir;
  try {
    load_sps_profile(dir.file("missing.json"));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("run `dspark profile"), std::string::npos) << e.what();
  }
  const nlohmann::json ok = {{"model", "m"}, {"threads", 2}, {"b", {1, 2}}, {"sps", {3.0, 2.0}}};
  EXPECT_NO_THROW(sps_profile_from_json(ok, "x"));
  auto bad = ok;
  bad["b"] = {2, 3};
  EXPECT_THROW(sps_profile_from_json(bad, "x"), FormatError);
  bad = ok;
  bad["sps"] = {3.0, 0.0};
  EXPECT_THROW(sps_profile_from_json(bad, "x"), FormatError);
  bad = ok;
  bad.erase("sps");
  EXPECT_THROW(sps_profile_from_json(bad, "x"), FormatError);
  // A profile of another model is named in a warning; the same model or an
  // unnamed one gives none.
  const SpsProfile prof = sps_profile_from_json(ok, "x");
  EXPECT_EQ(sps_profile_mismatch(prof, "p.json", "other"),
            "SPS profile p.json was measured for model m, not other; its verify costs may not fit this "
            "model (run `dspark profile -m MODEL` for it)");
  EXPECT_EQ(sps_profile_mismatch(prof, "p.json", "m"), "");
  EXPECT_EQ(sps_profile_mismatch(prof, "p.json", ""), "");
  const std::string p = default_profile_path("llama/Some Model:v1", 2);
  EXPECT_NE(p.find("/profiles/llama_Some_Model_v1_t2.json"), std::string::npos) << p;
}

TEST(SpsProfile, MonotoneKeepsTheFasterOfLaterPoints) {
  // SPS(2) = 5 would say two tokens cost more than three: disturbed, raised to SPS(3).
  std::vector<double> sps = {10, 12, 5, 6, 3};
  make_sps_monotone(sps);
  EXPECT_EQ(sps, (std::vector<double>{12, 12, 6, 6, 3}));
  std::vector<double> empty;
  make_sps_monotone(empty);
  EXPECT_TRUE(empty.empty());
}

TEST(SpsProfile, DefaultProfileIsMeasuredKeptAndRemeasuredWhenTooSlow) {
  TargetModel& t = spectest::tiny_target();
  test::TempDir dir;
  const std::string path = dir.file("profiles/p.json");
  SpsProfileOptions o;
  o.bmax = 4;
  o.context = 16;
  o.repetitions = 2;
  std::ostringstream log;
  // Missing: measured, saved, monotone.
  const std::vector<double> first = current_sps_profile(t, path, o, &log);
  ASSERT_EQ(first.size(), 4u);
  EXPECT_TRUE(std::is_sorted(first.rbegin(), first.rend())) << "non-increasing in B";
  EXPECT_NE(log.str().find("no SPS profile"), std::string::npos) << log.str();
  EXPECT_EQ(load_sps_profile(path).sps, first);

  // A profile that claims a far faster machine is kept as it is.
  SpsProfile fast = load_sps_profile(path);
  fast.sps = {4e9, 3e9, 2e9, 1e9};
  save_sps_profile(path, fast);
  EXPECT_FALSE(sps_profile_too_slow(t, fast, 4));
  log.str("");
  EXPECT_EQ(current_sps_profile(t, path, o, &log), fast.sps);
  EXPECT_EQ(log.str(), "");

  // One measured while other work ran (1000 s a call) is measured again and
  // replaced.
  SpsProfile slow = fast;
  slow.sps = {1e-3, 1e-3, 1e-3, 1e-3};
  save_sps_profile(path, slow);
  EXPECT_TRUE(sps_profile_too_slow(t, slow, 4));
  const std::vector<double> again = current_sps_profile(t, path, o, &log);
  EXPECT_NE(log.str().find("verifies faster"), std::string::npos) << log.str();
  for (double x : again) EXPECT_GT(x, 1.0);
  EXPECT_EQ(load_sps_profile(path).sps, again);

  // One whose blocks were timed under different loads (B = 1 on a quiet
  // machine, the rest while other work ran) is replaced whole, not kept at
  // B = 1: mixed, the curve says verifying 2 tokens costs over 2 steps.
  SpsProfile skewed = fast;
  skewed.sps = {4e9, 1e-3, 1e-3, 1e-3};
  save_sps_profile(path, skewed);
  log.str("");
  const std::vector<double> cured = current_sps_profile(t, path, o, &log);
  EXPECT_NE(log.str().find("verifies faster"), std::string::npos) << log.str();
  EXPECT_LT(cured[0], 1e9);
  for (double x : cured) EXPECT_GT(x, 1.0);
  EXPECT_TRUE(any_draft_can_pay(1, cured));
  EXPECT_EQ(load_sps_profile(path).sps, cured);

  // A longer curve (a server's) measured again for a short run keeps its
  // tail, scaled to meet the new points, and its multi-sequence curve.
  SpsProfile longer = load_sps_profile(path);
  longer.b = {1, 2, 3, 4, 5, 6, 7, 8};
  longer.sps = {1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 0.5e-3, 0.5e-3, 0.25e-3};
  longer.requests = 2;
  longer.multi_b = {2, 3, 4};
  longer.multi_sps = {7, 6, 5};
  save_sps_profile(path, longer);
  log.str("");
  const std::vector<double> merged = current_sps_profile(t, path, o, &log);
  EXPECT_NE(log.str().find("verifies faster"), std::string::npos) << log.str();
  ASSERT_EQ(merged.size(), 8u);
  EXPECT_DOUBLE_EQ(merged[4], merged[3]);  // old[4] = old[3]: scaled to the new SPS(4)
  EXPECT_DOUBLE_EQ(merged[5], merged[3] / 2);
  EXPECT_DOUBLE_EQ(merged[7], merged[3] / 4);
  const SpsProfile saved = load_sps_profile(path);
  EXPECT_EQ(saved.sps, merged);
  EXPECT_EQ(saved.b, (std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(saved.requests, 2);
  EXPECT_EQ(saved.multi_sps, longer.multi_sps);

  // Too few points for this block size, or another model: replaced.
  SpsProfile other = load_sps_profile(path);
  other.model = "another/model@quant@avx2";
  save_sps_profile(path, other);
  log.str("");
  current_sps_profile(t, path, o, &log);
  EXPECT_NE(log.str().find("is for another/model@quant@avx2, not " + sps_profile_key(t.info())), std::string::npos)
      << log.str();
  EXPECT_EQ(load_sps_profile(path).model, sps_profile_key(t.info()));
  o.bmax = 12;
  log.str("");
  EXPECT_EQ(current_sps_profile(t, path, o, &log).size(), 12u);
  EXPECT_NE(log.str().find("covers blocks of up to 4 tokens; this run verifies up to 12"), std::string::npos)
      << log.str();
  EXPECT_EQ(load_sps_profile(path).sps.size(), 12u);
  SpsProfile threads = load_sps_profile(path);
  threads.threads += 1;
  save_sps_profile(path, threads);
  log.str("");
  current_sps_profile(t, path, o, &log);
  EXPECT_NE(log.str().find("was measured with " + std::to_string(threads.threads) + " threads, not "),
            std::string::npos)
      << log.str();
}

// ---- lossless generation under every schedule ------------------------------------------

// Forwards to a drafter and adds up the verify length each drafting pass
// should get: prune_length (checkpoint thresholds on calibrated survival
// when temperatures exist), then the R = 1 scheduler when `sps` is set.
class ExpectingDrafter : public DraftModel {
 public:
  ExpectingDrafter(const DraftModel& inner, std::vector<double> thresholds, std::vector<double> sps)
      : inner_(inner), thresholds_(std::move(thresholds)), sps_(std::move(sps)) {}
  int gamma() const override { return inner_.gamma(); }
  const std::vector<int>& tap_layers() const override { return inner_.tap_layers(); }
  void check_target(const TargetInfo& t) const override { inner_.check_target(t); }
  std::vector<double> calibrated_thresholds() const override { return inner_.calibrated_thresholds(); }
  std::vector<double> calibrated_temperatures() const override { return inner_.calibrated_temperatures(); }
  void append_context(DraftState& st, const at::Tensor& feats) const override {
    inner_.append_context(st, feats);
  }
  Draft draft(const DraftState& st, TokenId anchor, int gamma, const SamplingParams& sampling,
              Rng& rng) const override {
    Draft d = inner_.draft(st, anchor, gamma, sampling, rng);
    const auto temps = inner_.calibrated_temperatures();
    int keep = prune_length(d.conf_logits, thresholds_, temps);
    if (!sps_.empty()) {
      const auto a = calibrated_survival(d.conf_logits, temps);
      keep = std::min(keep, schedule_single(std::vector<double>(a.begin(), a.begin() + keep), sps_));
    }
    kept += keep;
    return d;
  }
  mutable int64_t kept = 0;

 private:
  const DraftModel& inner_;
  std::vector<double> thresholds_, sps_;
};

TEST(ScheduleLossless, GreedyOutputUnchangedUnderEverySchedule) {
  TargetModel& t = spectest::tiny_target();
  DrafterConfig cfg = spectest::small_config(t.info(), SeqHead::Markov, 6);
  cfg.sts_temperatures = {0.5, 1.0, 2.0, 1.5, 3.0, 1.0};
  cfg.sts_thresholds = {0.0, 0.3, 0.2, 0.1, 0.05, 0.02};
  Drafter d = spectest::perturbed_drafter(cfg, 77);
  d.bind(t);
  const std::vector<TokenId> prompt = {1, 3 + 'H', 3 + 'i', 3 + ' ', 3 + 't', 3 + 'h', 3 + 'e'};
  const GenerateOptions o = spectest::greedy_options(40, {});
  const GenerateResult plain = generate_plain(t, prompt, o);

  // A noisy oracle on the same target accepts often, so schedules differ.
  const GenerateResult ref = generate_plain(t, prompt, spectest::greedy_options(120, {}));
  spectest::OracleDrafter oracle(spectest::OracleDrafter::Kind::Noisy, ref.tokens,
                                 static_cast<int64_t>(prompt.size()), t.info().vocab, 0.2, 5);
  oracle.set_gamma(6);
  oracle.set_conf_range(-1.0, 4.0);
  oracle.set_thresholds({0.0, 0.8, 0.8, 0.8, 0.8, 0.8});

  std::vector<double> steep;
  for (int b = 1; b <= 8; ++b) steep.push_back(100.0 / (1.0 + 0.35 * (b - 1)));
  const std::vector<double> flat(8, 100.0);

  struct Case {
    const char* name;
    bool prune;
    std::vector<double> sps;
  };
  const std::vector<Case> cases = {{"off", false, {}}, {"thresholds", true, {}},
                                   {"sps flat", false, flat}, {"sps steep", false, steep}};
  for (const DraftModel* inner : {static_cast<const DraftModel*>(&d), static_cast<const DraftModel*>(&oracle)}) {
    std::vector<int64_t> drafted;
    for (const Case& c : cases) {
      SpecOptions so;
      so.prune = c.prune;
      so.sps = c.sps;
      ExpectingDrafter rec(*inner, c.prune ? inner->calibrated_thresholds() : std::vector<double>{}, c.sps);
      const GenerateResult r = generate_speculative(t, rec, prompt, o, so);
      EXPECT_EQ(spectest::compare_runs(plain, r), "") << c.name;
      EXPECT_EQ(r.stats.drafted, rec.kept) << c.name;
      drafted.push_back(r.stats.drafted);
    }
    EXPECT_LE(drafted[1], drafted[0]);
    EXPECT_LE(drafted[3], drafted[2]);
    if (inner == &oracle) {
      EXPECT_LT(drafted[3], drafted[2]) << "the steep curve should shorten verify windows";
      EXPECT_LT(drafted[1], drafted[0]) << "thresholds should prune";
    }
  }
}

}  // namespace
}  // namespace dspark
