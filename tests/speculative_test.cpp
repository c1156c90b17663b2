// Lossless speculative decoding (dspark-method.md §5-6) on the real model:
// greedy output equals plain decoding token for token with random drafters of
// every head type and with oracle drafters (perfect, always wrong, noisy,
// cycling); the finish logic (stop ids inside blocks, -n budgets, callbacks,
// full context) matches plain decoding; confidence pruning resolves its
// thresholds as documented; the speculative-sampling verify rule is exact;
// sampled output has the plain distribution (chi-square homogeneity test);
// and a rolled-back KV cache equals a fresh prefill bit for bit.
//
// DSPARK_TEST_FULL=1 widens the sweeps (every γ 1..12, both pruning modes,
// all 40 dev prompts, longer outputs) and the statistical sample sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <map>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "dspark/error.hpp"
#include "dspark/speculative/runner.hpp"
#include "dspark/speculative/session.hpp"
#include "dspark/speculative/speculative.hpp"
#include "spec_test_util.hpp"

namespace {

using namespace dspark;
using dspark::spectest::OracleDrafter;
using dspark::spectest::RecordingDrafter;
using Kind = OracleDrafter::Kind;

constexpr double kMinConf = 0.5;  // pruning threshold of the "prune on" runs

std::vector<int> sweep_gammas() {
  if (spectest::full_mode()) {
    std::vector<int> g(12);
    std::iota(g.begin(), g.end(), 1);
    return g;
  }
  return {1, 4, 7, 12};
}

std::vector<size_t> sweep_prompts() {
  return spectest::spread_prompts(spectest::full_mode() ? spectest::dev_prompts().size() : 8);
}

int64_t sweep_n() { return spectest::full_mode() ? 48 : 24; }

SpecOptions spec_options(int gamma, bool prune) {
  SpecOptions s;
  s.gamma = gamma;
  s.prune = prune;
  if (prune) s.min_conf = kMinConf;
  return s;
}

std::vector<double> prune_thresholds(int gamma, bool prune) {
  return prune ? std::vector<double>(static_cast<size_t>(gamma), kMinConf) : std::vector<double>{};
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::Perfect: return "perfect";
    case Kind::Noisy: return "noisy";
    case Kind::Wrong: return "wrong";
    case Kind::Cycle: return "cycle";
  }
  return "?";
}

// Collects failures of a sweep; reports the first few in full.
struct Failures {
  int64_t count = 0;
  std::ostringstream text;
  void add(const std::string& what) {
    if (count++ < 8) text << "\n  " << what;
  }
  std::string str() const { return std::to_string(count) + " failing case(s):" + text.str(); }
};

// Accepted-prefix length of every verify round, from SpecOptions::on_round.
struct RoundLog {
  std::vector<int> n_acc;  // accepted drafts per round
  std::vector<int> ell;    // verified drafts per round
  RoundCallback callback() {
    return [this](int k, float, bool survived) {
      if (k == 0) {
        n_acc.push_back(0);
        ell.push_back(0);
      }
      ++ell.back();
      if (survived) ++n_acc.back();
    };
  }
};

// Internal consistency of a speculative run's statistics.
std::string stats_problem(const GenerateResult& r) {
  const auto& s = r.stats;
  std::ostringstream os;
  if (s.generated_tokens != static_cast<int64_t>(r.tokens.size())) os << "generated_tokens != tokens.size(); ";
  if (s.target_calls != s.rounds) os << "target_calls " << s.target_calls << " != rounds " << s.rounds << "; ";
  if (s.accepted > s.drafted) os << "accepted > drafted; ";
  int64_t acc = 0, reached0 = 0;
  for (size_t k = 0; k < s.accepted_by_position.size(); ++k) {
    acc += s.accepted_by_position[k];
    if (s.accepted_by_position[k] > s.reached_by_position[k]) os << "accepted > reached at " << k << "; ";
  }
  if (!s.reached_by_position.empty()) reached0 = s.reached_by_position[0];
  if (acc != s.accepted) os << "sum(accepted_by_position) " << acc << " != accepted " << s.accepted << "; ";
  if (reached0 > s.rounds) os << "reached_by_position[0] > rounds; ";
  return os.str();
}

// ---- greedy losslessness with random drafters of every head type -------------

class SpecGreedyHead : public ::testing::TestWithParam<SeqHead> {};

TEST_P(SpecGreedyHead, RandomDrafterMatchesPlain) {
  DSPARK_REAL_MODEL(lm);
  TargetModel& target = *lm.target;
  const SeqHead head = GetParam();
  const Drafter drafter = spectest::random_drafter(target, head);
  const auto prompts = sweep_prompts();
  const auto gammas = sweep_gammas();
  const int64_t n = sweep_n();

  struct Case {
    size_t prompt;
    int gamma;
    bool prune;
  };
  std::vector<Case> cases;
  if (spectest::full_mode()) {
    for (size_t p : prompts)
      for (int g : gammas)
        for (bool prune : {false, true}) cases.push_back({p, g, prune});
  } else {
    // Every γ on two of the eight prompts, one without and one with pruning;
    // the prompts rotate with the head so that each head sees all eight.
    const size_t h = static_cast<size_t>(head);
    if (spectest::level_run()) {
      // A per-level run (the scalar portable level takes ~10x as long): two
      // runs a head, one γ plain and a longer one pruned, rotating with the
      // head so that the five heads together take every γ without pruning
      // and every γ above 1 with it.
      cases.push_back({prompts[(2 * h) % prompts.size()], gammas[h % gammas.size()], false});
      cases.push_back({prompts[(2 * h + 1) % prompts.size()], gammas[1 + (h + 1) % (gammas.size() - 1)], true});
    } else {
      for (size_t gi = 0; gi < gammas.size(); ++gi)
        for (size_t r = 0; r < 2; ++r)
          cases.push_back({prompts[(2 * gi + r + 2 * h) % prompts.size()], gammas[gi], r == 1});
    }
  }

  Failures fails;
  int64_t pruned_passes = 0, prune_passes = 0, drafted = 0, accepted = 0;
  for (const Case& c : cases) {
    const auto& plain = spectest::plain_greedy(c.prompt, n, lm.stop_ids);
    RecordingDrafter rec(drafter, prune_thresholds(c.gamma, c.prune));
    const GenerateResult spec =
        generate_speculative(target, rec, spectest::dev_prompt_ids(c.prompt),
                             spectest::greedy_options(n, lm.stop_ids), spec_options(c.gamma, c.prune));
    std::ostringstream where;
    where << "head " << to_string(head) << " prompt " << c.prompt << " gamma " << c.gamma
          << " prune " << c.prune << ": ";
    if (auto d = spectest::compare_runs(plain, spec); !d.empty()) fails.add(where.str() + d);
    if (auto d = stats_problem(spec); !d.empty()) fails.add(where.str() + d);
    if (spec.stats.drafted != rec.kept)
      fails.add(where.str() + "drafted " + std::to_string(spec.stats.drafted) +
                " != positions kept by prune_length " + std::to_string(rec.kept));
    if (c.prune) {
      prune_passes += rec.passes;
      pruned_passes += rec.pruned;
    }
    drafted += spec.stats.drafted;
    accepted += spec.stats.accepted;
  }
  EXPECT_EQ(fails.count, 0) << fails.str();
  // min_conf 0.5 on the widened confidence head must actually cut blocks.
  EXPECT_GT(pruned_passes, 0) << "pruning never triggered";
  EXPECT_LT(pruned_passes, prune_passes) << "pruning cut every block";
  std::cout << "[ head " << to_string(head) << " ] " << cases.size() << " runs, " << drafted
            << " drafted, " << accepted << " accepted, pruning cut " << pruned_passes << "/"
            << prune_passes << " passes\n";
}

INSTANTIATE_TEST_SUITE_P(SpecHeads, SpecGreedyHead, ::testing::ValuesIn(spectest::all_heads()),
                         [](const ::testing::TestParamInfo<SeqHead>& i) { return to_string(i.param); });

// ---- the same sweep with a noisy oracle: partial acceptance, rollback --------

TEST(SpecGreedy, NoisyOracleMatchesPlain) {
  DSPARK_REAL_MODEL(lm);
  TargetModel& target = *lm.target;
  const auto prompts = sweep_prompts();
  const int64_t n = sweep_n();
  Failures fails;
  std::map<int, std::vector<int64_t>> prefix_hist;  // γ -> rounds by accepted-prefix length
  std::map<int, std::pair<int64_t, int64_t>> acc;   // γ -> (accepted, drafted)
  int64_t pruned_passes = 0;
  for (size_t pi = 0; pi < prompts.size(); ++pi) {
    const size_t p = prompts[pi];
    const auto& prompt = spectest::dev_prompt_ids(p);
    const auto& plain = spectest::plain_greedy(p, n, lm.stop_ids);
    const std::vector<TokenId> ref = spectest::reference_continuation(p, n + 13);
    for (int g : sweep_gammas()) {
      std::vector<bool> prunes = {pi % 2 == 1};
      if (spectest::full_mode()) prunes = {false, true};
      for (bool prune : prunes) {
        OracleDrafter oracle(Kind::Noisy, ref, static_cast<int64_t>(prompt.size()),
                             target.info().vocab, 0.3, 1000 + 31 * p + static_cast<uint64_t>(g));
        oracle.set_conf_range(-1.0, 4.0);  // sigmoid below 0.5 for a fifth of the slots
        RecordingDrafter rec(oracle, prune_thresholds(g, prune));
        RoundLog log;
        SpecOptions so = spec_options(g, prune);
        so.on_round = log.callback();
        const GenerateResult spec =
            generate_speculative(target, rec, prompt, spectest::greedy_options(n, lm.stop_ids), so);
        std::ostringstream where;
        where << "noisy oracle prompt " << p << " gamma " << g << " prune " << prune << ": ";
        if (auto d = spectest::compare_runs(plain, spec); !d.empty()) fails.add(where.str() + d);
        if (auto d = stats_problem(spec); !d.empty()) fails.add(where.str() + d);
        if (oracle.anchor_mismatches != 0) fails.add(where.str() + "anchor left the plain path");
        if (spec.stats.drafted != rec.kept) fails.add(where.str() + "drafted != positions kept");
        auto& h = prefix_hist[g];
        h.resize(static_cast<size_t>(g) + 1, 0);
        for (int a : log.n_acc) ++h[static_cast<size_t>(a)];
        acc[g].first += spec.stats.accepted;
        acc[g].second += spec.stats.drafted;
        pruned_passes += rec.pruned;
      }
    }
  }
  EXPECT_EQ(fails.count, 0) << fails.str();
  EXPECT_GT(pruned_passes, 0) << "pruning never triggered";
  // Partial acceptance for every γ; accepted-prefix lengths 0..min(γ, L) occur.
  const int L = spectest::full_mode() ? 6 : 3;
  for (const auto& [g, ad] : acc) {
    EXPECT_GT(ad.first, 0) << "gamma " << g;
    EXPECT_LT(ad.first, ad.second) << "gamma " << g;
    std::ostringstream hist;
    for (int64_t c : prefix_hist[g]) hist << " " << c;
    for (int a = 0; a <= std::min(g, L); ++a)
      EXPECT_GT(prefix_hist[g][static_cast<size_t>(a)], 0)
          << "gamma " << g << ": no round accepted exactly " << a << " drafts; histogram" << hist.str();
    std::cout << "[ noisy gamma " << g << " ] acceptance " << ad.first << "/" << ad.second
              << ", rounds by accepted prefix:" << hist.str() << "\n";
  }
}

// ---- finish logic ----------------------------------------------------------------

GenerateResult run_oracle(TargetModel& target, Kind kind, const std::vector<TokenId>& prompt,
                          const std::vector<TokenId>& ref, int gamma, const GenerateOptions& opts,
                          uint64_t seed = 5) {
  OracleDrafter oracle(kind, ref, static_cast<int64_t>(prompt.size()), target.info().vocab, 0.3, seed);
  return generate_speculative(target, oracle, prompt, opts, spec_options(gamma, false));
}

TEST(SpecFinish, StopIdAtEveryBlockPosition) {
  DSPARK_REAL_MODEL(lm);
  TargetModel& target = *lm.target;
  const size_t p = 20;
  const auto& prompt = spectest::dev_prompt_ids(p);
  const std::vector<TokenId> ref = spectest::reference_continuation(p, 48);
  Failures fails;
  std::vector<bool> stop_index_seen(16, false);
  for (int j = 0; j < 16; ++j) {
    // The stop id is the token at position j of the unstopped output.
    const GenerateOptions opts = spectest::greedy_options(40, {ref[static_cast<size_t>(j)]});
    const GenerateResult plain = generate_plain(target, prompt, opts);
    ASSERT_TRUE(plain.stopped_by_eog) << "j " << j;
    stop_index_seen[plain.tokens.size()] = true;
    for (int gamma : {7}) {
      for (Kind kind : {Kind::Perfect, Kind::Noisy, Kind::Wrong}) {
        const GenerateResult spec = run_oracle(target, kind, prompt, ref, gamma, opts, 77 + j);
        std::ostringstream where;
        where << kind_name(kind) << " gamma " << gamma << " stop at " << j << ": ";
        if (auto d = spectest::compare_runs(plain, spec); !d.empty()) fails.add(where.str() + d);
        if (auto d = stats_problem(spec); !d.empty()) fails.add(where.str() + d);
        if (kind == Kind::Wrong) {
          // Every token after the first is a correction; the stop id is one too.
          if (spec.stats.accepted != 0 ||
              spec.stats.rounds != static_cast<int64_t>(plain.tokens.size()))
            fails.add(where.str() + "always-wrong oracle: accepted " +
                      std::to_string(spec.stats.accepted) + ", rounds " +
                      std::to_string(spec.stats.rounds));
        }
      }
    }
  }
  EXPECT_EQ(fails.count, 0) << fails.str();
  // The stop fired at most positions 0..15 (earlier when the token repeats).
  EXPECT_GE(std::count(stop_index_seen.begin(), stop_index_seen.end(), true), 12);
}

TEST(SpecFinish, StopIdAsCorrectionToken) {
  DSPARK_REAL_MODEL(lm);
  TargetModel& target = *lm.target;
  const size_t p = 20;
  const auto& prompt = spectest::dev_prompt_ids(p);
  const std::vector<TokenId> ref = spectest::reference_continuation(p, 48);
  Failures fails;
  for (int j : {1, 2, 5, 9, 15}) {
    const GenerateOptions opts = spectest::greedy_options(40, {ref[static_cast<size_t>(j)]});
    const GenerateResult plain = generate_plain(target, prompt, opts);
    for (int gamma : {1, 12}) {  // γ = 7 is in the table above
      const GenerateResult spec = run_oracle(target, Kind::Wrong, prompt, ref, gamma, opts);
      std::ostringstream where;
      where << "gamma " << gamma << " stop at " << j << ": ";
      if (auto d = spectest::compare_runs(plain, spec); !d.empty()) fails.add(where.str() + d);
      if (spec.stats.accepted != 0) fails.add(where.str() + "accepted a wrong draft");
      EXPECT_TRUE(spec.stopped_by_eog) << where.str();
    }
  }
  EXPECT_EQ(fails.count, 0) << fails.str();
}

TEST(SpecFinish, BudgetEndsInsideBlock) {
  DSPARK_REAL_MODEL(lm);
  TargetModel& target = *lm.target;
  const size_t p = 10;
  const auto& prompt = spectest::dev_prompt_ids(p);
  const std::vector<TokenId> ref = spectest::reference_continuation(p, 48);
  Failures fails;
  for (int64_t n = 1; n <= 20; ++n) {
    const GenerateResult& plain = spectest::plain_greedy(p, n, lm.stop_ids);
    ASSERT_EQ(plain.stats.generated_tokens, n) << "prompt " << p << " stops before 20 tokens";
    for (Kind kind : {Kind::Perfect, Kind::Noisy, Kind::Wrong}) {
      // The always-wrong oracle runs one round per token: a few budgets suffice.
      if (kind == Kind::Wrong && n > 3 && n != 5 && n != 8 && n != 13 && n != 20) continue;
      OracleDrafter oracle(kind, ref, static_cast<int64_t>(prompt.size()), target.info().vocab, 0.3,
                           static_cast<uint64_t>(11 + n));
      RoundLog log;
      SpecOptions so = spec_options(7, false);
      so.on_round = log.callback();
      const GenerateResult spec =
          generate_speculative(target, oracle, prompt, spectest::greedy_options(n, lm.stop_ids), so);
      std::ostringstream where;
      where << kind_name(kind) << " n_predict " << n << ": ";
      if (auto d = spectest::compare_runs(plain, spec); !d.empty()) fails.add(where.str() + d);
      if (auto d = stats_problem(spec); !d.empty()) fails.add(where.str() + d);
      // No round verifies more drafts than the tokens still allowed.
      int64_t emitted = 1;
      for (size_t r = 0; r < log.ell.size(); ++r) {
        if (log.ell[r] > n - emitted)
          fails.add(where.str() + "round " + std::to_string(r) + " verified " +
                    std::to_string(log.ell[r]) + " drafts with " + std::to_string(n - emitted) +
                    " tokens left");
        emitted += log.n_acc[r] + 1;
      }
    }
  }
  EXPECT_EQ(fails.count, 0) << fails.str();
}

TEST(SpecFinish, CallbackStopsGeneration) {
  DSPARK_REAL_MODEL(lm);
  TargetModel& target = *lm.target;
  const size_t p = 10;
  const auto& prompt = spectest::dev_prompt_ids(p);
  const std::vector<TokenId> ref = spectest::reference_continuation(p, 48);
  Failures fails;
  for (int stop_after = 1; stop_after <= 10; ++stop_after) {
    std::vector<TokenId> seen_plain, seen_spec;
    GenerateOptions opts = spectest::greedy_options(30, lm.stop_ids);
    opts.on_token = [&](TokenId t) {
      seen_plain.push_back(t);
      return static_cast<int>(seen_plain.size()) < stop_after;
    };
    const GenerateResult plain = generate_plain(target, prompt, opts);
    for (Kind kind : {Kind::Perfect, Kind::Noisy}) {
      seen_spec.clear();
      opts.on_token = [&](TokenId t) {
        seen_spec.push_back(t);
        return static_cast<int>(seen_spec.size()) < stop_after;
      };
      const GenerateResult spec = run_oracle(target, kind, prompt, ref, 7, opts);
      std::ostringstream where;
      where << kind_name(kind) << " callback stop after " << stop_after << ": ";
      if (auto d = spectest::compare_runs(plain, spec); !d.empty()) fails.add(where.str() + d);
      if (seen_spec != spec.tokens) fails.add(where.str() + "callback saw " + spectest::ids_str(seen_spec));
    }
  }
  EXPECT_EQ(fails.count, 0) << fails.str();
}

TEST(SpecFinish, ContextFull) {
  DSPARK_REAL_MODEL(lm);
  TargetModel& target = *lm.target;
  const size_t p = 10;
  const auto& prompt = spectest::dev_prompt_ids(p);
  const std::vector<TokenId> ref = spectest::reference_continuation(p, 48);
  const int64_t P = static_cast<int64_t>(prompt.size());
  Failures fails;
  // Room for 0..γ drafts in the last rounds, and more.
  for (int64_t extra : {1, 2, 3, 4, 6, 8, 9, 12}) {
    GenerateOptions opts = spectest::greedy_options(100, {});
    opts.ctx_size = P + extra;
    const GenerateResult plain = generate_plain(target, prompt, opts);
    for (Kind kind : {Kind::Perfect, Kind::Noisy, Kind::Wrong}) {
      const GenerateResult spec = run_oracle(target, kind, prompt, ref, 7, opts);
      std::ostringstream where;
      where << kind_name(kind) << " ctx " << opts.ctx_size << " (prompt " << P << "): ";
      if (auto d = spectest::compare_runs(plain, spec); !d.empty()) fails.add(where.str() + d);
    }
  }
  EXPECT_EQ(fails.count, 0) << fails.str();
}

TEST(SpecErrors, NonFiniteLogitsAreAnError) {
  // Corrupt weights show as NaN or +inf logits: an error naming the token,
  // not garbage text. -inf (a masked token) is fine.
  std::vector<float> logits = {0.5f, -INFINITY, 2.0f, 1.0f};
  EXPECT_EQ(argmax(logits.data(), 4), 2);
  SamplingParams p;
  p.temperature = 0.8f;
  EXPECT_EQ(process_logits(logits.data(), 4, p).ids.front(), 2);
  for (float badv : {NAN, INFINITY}) {
    logits[3] = badv;
    for (int which = 0; which < 2; ++which) {
      try {
        if (which == 0) argmax(logits.data(), 4);
        else process_logits(logits.data(), 4, p);
        ADD_FAILURE() << "accepted " << badv;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(std::isnan(badv) ? "a NaN logit (token 3)" : "an infinite logit (token 3)"),
                  std::string::npos)
            << e.what();
      }
    }
  }
}

TEST(SpecErrors, SameRefusalsAsPlain) {
  DSPARK_REAL_MODEL(lm);
  TargetModel& target = *lm.target;
  const std::vector<TokenId> ref = spectest::reference_continuation(0, 8);
  OracleDrafter oracle(Kind::Perfect, ref, 1, target.info().vocab);
  const GenerateOptions opts = spectest::greedy_options(4, {});
  EXPECT_THROW(generate_speculative(target, oracle, {}, opts, {}), InvalidArgument);
  GenerateOptions small = opts;
  small.ctx_size = 4;
  EXPECT_THROW(generate_speculative(target, oracle, {1, 2, 3, 4}, small, {}), InvalidArgument);
  SpecOptions big;
  big.gamma = kMaxGamma + 1;
  EXPECT_THROW(generate_speculative(target, oracle, {1, 2, 3}, opts, big), InvalidArgument);
  GenerateOptions bad = opts;
  bad.sampling.temperature = -1.f;
  EXPECT_THROW(generate_speculative(target, oracle, {1, 2, 3}, bad, {}), InvalidArgument);
}

// ---- oracle drafters: every draft accepted / none accepted --------------------

TEST(SpecOracle, PerfectOracleAcceptsEverything) {
  DSPARK_REAL_MODEL(lm);
  TargetModel& target = *lm.target;
  const size_t p = 15;
  const auto& prompt = spectest::dev_prompt_ids(p);
  const int64_t rounds = 3;
  const std::vector<TokenId> ref = spectest::reference_continuation(p, 1 + rounds * 13 + 13);
  for (int g = 1; g <= 12; ++g) {
    // 1 + rounds·(γ+1) tokens: the prefill token, then `rounds` full rounds of
    // γ accepted drafts plus the bonus token.
    const int64_t n = 1 + rounds * (g + 1);
    const GenerateResult spec =
        run_oracle(target, Kind::Perfect, prompt, ref, g, spectest::greedy_options(n, {}));
    const std::vector<TokenId> want(ref.begin(), ref.begin() + n);
    EXPECT_EQ(spec.tokens, want) << "gamma " << g;
    const auto& s = spec.stats;
    EXPECT_EQ(s.rounds, rounds) << "gamma " << g;
    EXPECT_EQ(s.drafted, rounds * g) << "gamma " << g;
    EXPECT_EQ(s.accepted, s.drafted) << "gamma " << g;
    EXPECT_DOUBLE_EQ(s.tau(), g + 1.0) << "gamma " << g;
    const auto a = s.acceptance_by_position();
    ASSERT_EQ(a.size(), static_cast<size_t>(g));
    for (int k = 0; k < g; ++k) {
      EXPECT_EQ(a[static_cast<size_t>(k)], 1.0) << "gamma " << g << " position " << k;
      EXPECT_EQ(s.reached_by_position[static_cast<size_t>(k)], rounds) << "gamma " << g << " position " << k;
    }
    EXPECT_EQ(stats_problem(spec), "");
  }
}

TEST(SpecOracle, AlwaysWrongOracleAcceptsNothing) {
  DSPARK_REAL_MODEL(lm);
  TargetModel& target = *lm.target;
  const size_t p = 20;
  const auto& prompt = spectest::dev_prompt_ids(p);
  const int64_t n = 12;
  const std::vector<TokenId> ref = spectest::reference_continuation(p, n + 13);
  const GenerateResult& plain = spectest::plain_greedy(p, n, lm.stop_ids);
  for (int g : sweep_gammas()) {
    const GenerateResult spec =
        run_oracle(target, Kind::Wrong, prompt, ref, g, spectest::greedy_options(n, lm.stop_ids));
    EXPECT_EQ(spectest::compare_runs(plain, spec), "") << "gamma " << g;
    const auto& s = spec.stats;
    EXPECT_EQ(s.accepted, 0) << "gamma " << g;
    EXPECT_GT(s.drafted, 0) << "gamma " << g;
    EXPECT_EQ(s.tau(), 1.0) << "gamma " << g;
    // One round per token after the first (plus the round whose correction is a stop id).
    EXPECT_EQ(s.rounds, static_cast<int64_t>(plain.tokens.size()) - 1 + (plain.stopped_by_eog ? 1 : 0))
        << "gamma " << g;
    EXPECT_EQ(s.reached_by_position[0], s.rounds) << "gamma " << g;
    // Only position 0 was ever reached: one entry, 0 accepted.
    EXPECT_EQ(s.acceptance_by_position(), std::vector<double>{0.0}) << "gamma " << g;
    for (int k = 1; k < g; ++k) EXPECT_EQ(s.reached_by_position[static_cast<size_t>(k)], 0) << "gamma " << g;
  }
}

TEST(SpecOracle, EveryAcceptedPrefixLength) {
  DSPARK_REAL_MODEL(lm);
  TargetModel& target = *lm.target;
  const size_t p = 23;
  const auto& prompt = spectest::dev_prompt_ids(p);
  const std::vector<TokenId> ref = spectest::reference_continuation(p, 1 + 13 * 14 / 2 + 13);
  for (int g = 1; g <= 12; ++g) {
    // Rounds c = 0..γ accept exactly c drafts and emit c + 1 tokens.
    const int64_t n = 1 + (g + 1) * (g + 2) / 2;
    OracleDrafter oracle(Kind::Cycle, ref, static_cast<int64_t>(prompt.size()), target.info().vocab);
    RoundLog log;
    SpecOptions so = spec_options(g, false);
    so.on_round = log.callback();
    const GenerateResult spec =
        generate_speculative(target, oracle, prompt, spectest::greedy_options(n, {}), so);
    const std::vector<TokenId> want(ref.begin(), ref.begin() + n);
    EXPECT_EQ(spec.tokens, want) << "gamma " << g;
    std::vector<int> expect(static_cast<size_t>(g) + 1);
    std::iota(expect.begin(), expect.end(), 0);
    EXPECT_EQ(log.n_acc, expect) << "gamma " << g;
    EXPECT_EQ(spec.stats.accepted, static_cast<int64_t>(g) * (g + 1) / 2) << "gamma " << g;
    for (int k = 0; k < g; ++k) {
      // Position k is reached by rounds c >= k and accepted by rounds c > k.
      EXPECT_EQ(spec.stats.reached_by_position[static_cast<size_t>(k)], g + 1 - k) << "gamma " << g;
      EXPECT_EQ(spec.stats.accepted_by_position[static_cast<size_t>(k)], g - k) << "gamma " << g;
    }
  }
}

// ---- pruning: threshold resolution ----------------------------------------------

TEST(SpecPrune, ThresholdResolution) {
  DSPARK_REAL_MODEL(lm);
  TargetModel& target = *lm.target;
  const size_t p = 30;
  const auto& prompt = spectest::dev_prompt_ids(p);
  const int g = 6;
  const int64_t n = 1 + 2 * (g + 1);
  const std::vector<TokenId> ref = spectest::reference_continuation(p, n + 13);
  const std::vector<TokenId> want(ref.begin(), ref.begin() + n);
  // Every slot has confidence sigmoid(0.4055) = 0.6; calibration says 0.7 from position 2.
  OracleDrafter oracle(Kind::Perfect, ref, static_cast<int64_t>(prompt.size()), target.info().vocab);
  oracle.set_conf_range(0.4055, 0.4055);
  oracle.set_thresholds({0.0, 0.0, 0.7, 0.7, 0.7, 0.7});
  struct Case {
    const char* what;
    SpecOptions opts;
    int expect_ell;  // verified drafts per round
  };
  auto make = [&](bool prune, std::optional<std::vector<double>> th, double min_conf) {
    SpecOptions s;
    s.gamma = g;
    s.prune = prune;
    s.thresholds = std::move(th);
    s.min_conf = min_conf;
    return s;
  };
  const std::vector<Case> cases = {
      {"calibration", make(true, std::nullopt, -1), 2},
      {"explicit thresholds override calibration", make(true, std::vector<double>{0, 0, 0, 0.65}, -1), 3},
      {"explicit empty list disables", make(true, std::vector<double>{}, -1), g},
      {"min_conf overrides", make(true, std::vector<double>{0, 0, 0, 0.65}, 0.61), 1},
      {"min_conf below the confidence keeps all", make(true, std::nullopt, 0.59), g},
      {"prune off ignores everything", make(false, std::vector<double>{0, 0.9}, 0.9), g},
  };
  for (const Case& c : cases) {
    RoundLog log;
    SpecOptions so = c.opts;
    so.on_round = log.callback();
    const GenerateResult spec =
        generate_speculative(target, oracle, prompt, spectest::greedy_options(n, {}), so);
    EXPECT_EQ(spec.tokens, want) << c.what;
    ASSERT_FALSE(log.ell.empty()) << c.what;
    // Every round but the last (cut by the budget) verifies expect_ell drafts.
    for (size_t r = 0; r + 1 < log.ell.size(); ++r) EXPECT_EQ(log.ell[r], c.expect_ell) << c.what;
    EXPECT_EQ(spec.stats.accepted, spec.stats.drafted) << c.what;
  }
}

// ---- the verify rule of speculative sampling, exactly --------------------------

Distribution dist(std::vector<std::pair<TokenId, double>> items) {
  double total = 0;
  for (const auto& it : items) total += it.second;
  std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) {
    return a.second > b.second || (a.second == b.second && a.first < b.first);
  });
  Distribution d;
  for (const auto& [id, w] : items) {
    if (w <= 0) continue;
    d.ids.push_back(id);
    d.probs.push_back(static_cast<float>(w / total));
  }
  return d;
}

// The distribution of the emitted token when x ~ q is verified against p:
// accepted x with probability q(x)·a(x), else a draw from the residual.
std::map<TokenId, double> emitted_distribution(const Distribution& p, const Distribution& q) {
  std::map<TokenId, double> out;
  double accept_mass = 0;
  for (size_t i = 0; i < q.ids.size(); ++i) {
    const double m = static_cast<double>(q.probs[i]) * accept_probability(p, q, q.ids[i]);
    out[q.ids[i]] += m;
    accept_mass += m;
  }
  const Distribution r = residual(p, q);
  for (size_t i = 0; i < r.ids.size(); ++i)
    out[r.ids[i]] += (1.0 - accept_mass) * static_cast<double>(r.probs[i]);
  return out;
}

void expect_lossless(const Distribution& p, const Distribution& q, const std::string& what) {
  const auto e = emitted_distribution(p, q);
  std::map<TokenId, double> want;
  for (size_t i = 0; i < p.ids.size(); ++i) want[p.ids[i]] = p.probs[i];
  for (const auto& [id, m] : e) want.emplace(id, 0.0);
  for (const auto& [id, pv] : want) {
    const double got = e.count(id) ? e.at(id) : 0.0;
    EXPECT_NEAR(got, pv, 1e-6) << what << ": token " << id;
  }
}

TEST(SpecVerify, EmittedDistributionEqualsTarget) {
  const Distribution p = dist({{1, 0.5}, {2, 0.3}, {3, 0.2}});
  expect_lossless(p, dist({{4, 0.6}, {5, 0.4}}), "disjoint supports");
  expect_lossless(p, p, "q = p");
  expect_lossless(p, dist({{2, 1.0}}), "q one-hot inside p");
  expect_lossless(p, dist({{9, 1.0}}), "q one-hot outside p");
  expect_lossless(p, dist({{1, 0.9}, {2, 0.05}, {3, 0.05}}), "q concentrated on p's mode");
  expect_lossless(p, dist({{3, 0.9}, {1, 0.1}}), "q concentrated on p's tail");
  expect_lossless(dist({{1, 0.7}, {2, 0.3}}), dist({{1, 0.25}, {2, 0.25}, {3, 0.25}, {4, 0.25}}),
                  "p with zeros where q has mass");
  expect_lossless(dist({{1, 1.0}}), dist({{1, 0.5}, {2, 0.5}}), "p one-hot");
  // Random pairs over 12 ids with random zeros in both.
  std::mt19937_64 rng(42);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<std::pair<TokenId, double>> pi, qi;
    for (TokenId id = 0; id < 12; ++id) {
      if (u(rng) < 0.7) pi.push_back({id, u(rng) * u(rng)});
      if (u(rng) < 0.7) qi.push_back({id, u(rng) * u(rng)});
    }
    if (pi.empty()) pi.push_back({0, 1.0});
    if (qi.empty()) qi.push_back({11, 1.0});
    expect_lossless(dist(pi), dist(qi), "random trial " + std::to_string(trial));
    if (HasFailure()) break;
  }
}

TEST(SpecVerify, AcceptProbabilityAndToken) {
  const Distribution p = dist({{1, 0.5}, {2, 0.25}, {3, 0.25}});
  const Distribution q = dist({{1, 0.25}, {2, 0.5}, {4, 0.25}});
  EXPECT_DOUBLE_EQ(accept_probability(p, q, 1), 1.0);  // p > q: always
  EXPECT_DOUBLE_EQ(accept_probability(p, q, 2), 0.5);  // p/q
  EXPECT_DOUBLE_EQ(accept_probability(p, q, 4), 0.0);  // outside p
  // q(x) = 0 is clamped to 1e-8.
  EXPECT_DOUBLE_EQ(accept_probability(p, q, 3), 1.0);
  EXPECT_NEAR(accept_probability(dist({{1, 1e-9}, {2, 1.0}}), dist({{2, 1.0}}), 1), 0.1, 1e-6);
  // Accept iff u < a.
  EXPECT_TRUE(accept_token(p, q, 2, 0.4999));
  EXPECT_FALSE(accept_token(p, q, 2, 0.5));
  EXPECT_TRUE(accept_token(p, q, 1, 0.999999));
  EXPECT_FALSE(accept_token(p, q, 4, 0.0));
}

TEST(SpecVerify, ResidualIsNormalizedPositivePart) {
  const Distribution p = dist({{1, 0.5}, {2, 0.3}, {3, 0.2}});
  const Distribution r = residual(p, dist({{1, 0.6}, {2, 0.1}, {4, 0.3}}));
  // max(0, p - q) = {2: 0.2, 3: 0.2}, normalized; ties in ascending id order.
  ASSERT_EQ(r.ids, (std::vector<TokenId>{2, 3}));
  EXPECT_NEAR(r.probs[0], 0.5, 1e-7);
  EXPECT_NEAR(r.probs[1], 0.5, 1e-7);
  // Sorted by descending probability.
  const Distribution r2 = residual(p, dist({{1, 0.45}, {3, 0.55}}));
  ASSERT_EQ(r2.ids, (std::vector<TokenId>{2, 1}));
  EXPECT_NEAR(r2.probs[0], 0.3 / 0.35, 1e-6);
  EXPECT_NEAR(r2.probs[1], 0.05 / 0.35, 1e-6);
}

TEST(SpecVerify, NonFiniteDraftDistributionIsRejectedAndResampledFromTarget) {
  // A drafter with NaN weights yields NaN draft probabilities. Its token must
  // never be accepted (min(1, p / NaN) would otherwise read as 1), and the
  // correction must come from p itself.
  Distribution p;
  p.ids = {3, 5, 9};
  p.probs = {0.5f, 0.3f, 0.2f};
  for (float bad : {std::nanf(""), INFINITY, -0.25f}) {
    Distribution q;
    q.ids = {5, 3};
    q.probs = {bad, 0.4f};
    EXPECT_EQ(accept_probability(p, q, 5), 0.0) << bad;
    EXPECT_EQ(accept_probability(p, q, 3), 0.0) << bad;
    EXPECT_FALSE(accept_token(p, q, 3, 0.0)) << bad;
    const Distribution r = residual(p, q);
    EXPECT_EQ(r.ids, p.ids) << bad;
    EXPECT_EQ(r.probs, p.probs) << bad;
  }
  Distribution empty;
  EXPECT_EQ(accept_probability(p, empty, 3), 0.0);
  // A usable q is unaffected.
  Distribution q;
  q.ids = {5, 3};
  q.probs = {0.6f, 0.4f};
  EXPECT_DOUBLE_EQ(accept_probability(p, q, 5), static_cast<double>(0.3f) / static_cast<double>(0.6f));
  EXPECT_DOUBLE_EQ(accept_probability(p, q, 3), 1.0);
}

TEST(SpecVerify, ResidualFallsBackToTargetWhenMassVanishes) {
  const Distribution p = dist({{1, 0.5}, {2, 0.3}, {3, 0.2}});
  for (const Distribution& q : {p, dist({{1, 0.5 + 1e-12}, {2, 0.3}, {3, 0.2 - 1e-12}})}) {
    const Distribution r = residual(p, q);
    EXPECT_EQ(r.ids, p.ids);
    EXPECT_EQ(r.probs, p.probs);
  }
}

// ---- sampled output has the plain distribution ----------------------------------

// Regularized upper incomplete gamma Q(a, x) (Numerical Recipes: series below
// a + 1, Lentz continued fraction above).
double gamma_q(double a, double x) {
  if (x <= 0) return 1.0;
  const double lg = std::lgamma(a);
  if (x < a + 1) {
    double sum = 1.0 / a, term = sum, n = a;
    for (int i = 0; i < 100000; ++i) {
      n += 1;
      term *= x / n;
      sum += term;
      if (std::fabs(term) < std::fabs(sum) * 1e-16) break;
    }
    return 1.0 - sum * std::exp(-x + a * std::log(x) - lg);
  }
  const double tiny = 1e-300;
  double b = x + 1 - a, c = 1 / tiny, d = 1 / b, h = d;
  for (int i = 1; i < 100000; ++i) {
    const double an = -i * (i - a);
    b += 2;
    d = an * d + b;
    if (std::fabs(d) < tiny) d = tiny;
    c = b + an / c;
    if (std::fabs(c) < tiny) c = tiny;
    d = 1 / d;
    const double del = d * c;
    h *= del;
    if (std::fabs(del - 1) < 1e-16) break;
  }
  return std::exp(-x + a * std::log(x) - lg) * h;
}

double chi2_sf(double x, int df) { return gamma_q(df / 2.0, x / 2.0); }

using Outcome = std::array<TokenId, 3>;
using Counts = std::map<Outcome, int64_t>;

struct Homogeneity {
  double stat = 0;
  int df = 0;
  double p = 1;
  std::string str() const {
    std::ostringstream os;
    os << "chi2 " << stat << " df " << df << " p " << p;
    return os.str();
  }
};

// Pearson chi-square two-sample homogeneity test on outcome counts. Cells
// whose combined count is below 10 (expected count below 5 per sample at equal
// sizes) are pooled into one cell; a pooled cell still below 10 joins the
// smallest kept cell.
Homogeneity homogeneity(const Counts& a, const Counts& b) {
  int64_t na = 0, nb = 0;
  std::map<Outcome, std::pair<int64_t, int64_t>> cells;
  for (const auto& [o, c] : a) {
    cells[o].first += c;
    na += c;
  }
  for (const auto& [o, c] : b) {
    cells[o].second += c;
    nb += c;
  }
  std::vector<std::pair<int64_t, int64_t>> kept;
  std::pair<int64_t, int64_t> pooled{0, 0};
  for (const auto& [o, c] : cells) {
    if (c.first + c.second < 10) {
      pooled.first += c.first;
      pooled.second += c.second;
    } else {
      kept.push_back(c);
    }
  }
  if (pooled.first + pooled.second > 0) {
    if (pooled.first + pooled.second >= 10 || kept.empty()) {
      kept.push_back(pooled);
    } else {
      auto smallest = std::min_element(kept.begin(), kept.end(), [](const auto& x, const auto& y) {
        return x.first + x.second < y.first + y.second;
      });
      smallest->first += pooled.first;
      smallest->second += pooled.second;
    }
  }
  Homogeneity h;
  const double N = static_cast<double>(na + nb);
  for (const auto& [ca, cb] : kept) {
    const double tot = static_cast<double>(ca + cb);
    const double ea = tot * static_cast<double>(na) / N, eb = tot * static_cast<double>(nb) / N;
    h.stat += (ca - ea) * (ca - ea) / ea + (cb - eb) * (cb - eb) / eb;
  }
  h.df = std::max<int>(1, static_cast<int>(kept.size()) - 1);
  h.p = kept.size() < 2 ? 1.0 : chi2_sf(h.stat, h.df);
  return h;
}

TEST(SpecStats, ChiSquareMachinery) {
  // Reference quantiles of the chi-square distribution.
  EXPECT_NEAR(chi2_sf(3.841459, 1), 0.05, 1e-6);
  EXPECT_NEAR(chi2_sf(29.58827, 10), 0.001, 1e-7);
  EXPECT_NEAR(chi2_sf(45.31475, 20), 0.001, 1e-7);
  EXPECT_NEAR(chi2_sf(103.4422, 63), 0.001, 1e-7);
  EXPECT_NEAR(chi2_sf(63.0, 63), 0.4763, 1e-4);
  // Same distribution: no rejection; a 5% shift between two outcomes at 20k
  // samples per group: rejection.
  std::mt19937_64 rng(7);
  auto draw = [&](const std::vector<double>& w, int64_t n) {
    std::discrete_distribution<int> d(w.begin(), w.end());
    Counts c;
    for (int64_t i = 0; i < n; ++i) ++c[{d(rng), 0, 0}];
    return c;
  };
  const std::vector<double> base = {0.3, 0.2, 0.15, 0.1, 0.1, 0.05, 0.05, 0.03, 0.015, 0.005};
  std::vector<double> shifted = base;
  shifted[1] -= 0.05;
  shifted[3] += 0.05;
  const Homogeneity same = homogeneity(draw(base, 20000), draw(base, 20000));
  EXPECT_GT(same.p, 0.001) << same.str();
  const Homogeneity diff = homogeneity(draw(base, 20000), draw(shifted, 20000));
  EXPECT_LT(diff.p, 1e-6) << diff.str();
}

// Sample-size design. Each sample is the joint outcome of the first three
// generated tokens at temperature 1.0, top-k 4 (at most 4^3 = 64 outcomes) for
// the raw prompt "The capital of France is"; sample i of a group uses seed
// mix64(base + i). The plain joint (computed exactly by enumerating the 64
// branches) has 11 outcomes above 1% (the largest 0.41), 44 above 0.025%.
//
// Power. For groups of n1 and n2 samples the Pearson statistic is
// approximately noncentral chi-square(df, λ), λ = n1·n2/(n1+n2) · Σ_c δ_c²/p̄_c
// for a shift δ between the groups (p̄ the pooled cell probabilities). A shift
// of total variation ε confined to outcomes holding pooled mass m has
// Σ δ²/p̄ >= (2ε)²/m (Cauchy–Schwarz).
//  - Full mode, 20,000 samples per group: pooling keeps ~45 cells (df ≈ 44,
//    critical value 78.7 at α = 0.001); power 0.9 needs λ >= 56.9, i.e.
//    Σ δ²/p̄ >= 0.0057. Any 2% TV shift confined to outcomes holding at most
//    28% of the mass — e.g. 2% moved between any two outcomes other than the
//    0.41 one — is detected with power >= 0.9; the T = 1.1 sanity check (TV
//    5.1%, Σ δ²/p̄ = 0.018, λ ≈ 180) with power ≈ 1. (A 2% shift spread evenly
//    over every outcome, the least detectable kind, would need ~71,000.)
//  - Default, 160 samples per group: ~8 cells (df ≈ 7, critical value 24.3),
//    power 0.9 needs λ >= 31.8, Σ δ²/p̄ >= 0.40: about a 14% TV shift between
//    two outcomes of probability <= 10%. The sanity check draws 100 samples at
//    T = 2.0 (TV 34% from T = 1.0, Σ δ²/p̄ = 0.69, λ ≈ 42, power ≈ 0.95).
int64_t samples_per_group() { return spectest::full_mode() ? 20000 : 160; }

SamplingParams stat_sampling(float temperature, uint64_t seed) {
  SamplingParams s;
  s.temperature = temperature;
  s.top_k = 4;
  s.top_p = 1.f;
  s.min_p = 0.f;
  s.seed = seed;
  return s;
}

const std::vector<TokenId>& stat_prompt() {
  static const std::vector<TokenId> p = spectest::real_model()->encode_prompt("The capital of France is", false);
  return p;
}

template <typename F>
Counts sample_outcomes(int64_t n, uint64_t seed_base, F&& generate) {
  Counts c;
  for (int64_t i = 0; i < n; ++i) {
    const GenerateResult r = generate(i, spectest::mix64(seed_base + static_cast<uint64_t>(i)));
    if (r.tokens.size() != 3) throw std::runtime_error("a sample emitted " + std::to_string(r.tokens.size()) + " tokens");
    ++c[{r.tokens[0], r.tokens[1], r.tokens[2]}];
  }
  return c;
}

GenerateOptions stat_options(float temperature, uint64_t seed) {
  GenerateOptions o;
  o.n_predict = 3;
  o.sampling = stat_sampling(temperature, seed);
  return o;
}

// Plain sampling at temperature 1.0, shared by the tests below.
const Counts& plain_counts() {
  static const Counts c = sample_outcomes(samples_per_group(), 1'000'000, [](int64_t, uint64_t seed) {
    return generate_plain(*spectest::real_model()->target, stat_prompt(), stat_options(1.f, seed));
  });
  return c;
}

std::string describe(const Counts& a, const Counts& b) {
  std::ostringstream os;
  os << a.size() << " vs " << b.size() << " distinct outcomes";
  return os.str();
}

// Expects `counts` to follow the plain distribution; prints the test figures.
void expect_plain_law(const Counts& counts, const std::string& label) {
  const Homogeneity h = homogeneity(plain_counts(), counts);
  EXPECT_GT(h.p, 0.001) << label << ": " << h.str() << "; " << describe(plain_counts(), counts);
  std::cout << "[ " << label << " ] " << h.str() << "\n";
}

TEST(SpecSampling, ReproducibleForASeed) {
  DSPARK_REAL_MODEL(lm);
  const Drafter d = spectest::random_drafter(*lm.target, SeqHead::Markov);
  GenerateOptions o = stat_options(1.f, 99);
  o.n_predict = 12;
  o.sampling.top_k = 40;
  const auto a = generate_speculative(*lm.target, d, stat_prompt(), o, spec_options(4, true));
  const auto b = generate_speculative(*lm.target, d, stat_prompt(), o, spec_options(4, true));
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(generate_plain(*lm.target, stat_prompt(), o).tokens,
            generate_plain(*lm.target, stat_prompt(), o).tokens);
}

TEST(SpecSampling, RandomDrafterMatchesPlainDistribution) {
  DSPARK_REAL_MODEL(lm);
  TargetModel& target = *lm.target;
  const Drafter d = spectest::random_drafter(target, SeqHead::Markov);
  int64_t drafted = 0;
  const Counts spec = sample_outcomes(samples_per_group(), 2'000'000, [&](int64_t i, uint64_t seed) {
    // Alternate pruning; pruning changes what is verified, never the output law.
    auto r = generate_speculative(target, d, stat_prompt(), stat_options(1.f, seed), spec_options(2, i % 2 == 1));
    drafted += r.stats.drafted;
    return r;
  });
  EXPECT_GT(drafted, 0);
  expect_plain_law(spec, "random drafter");
}

TEST(SpecSampling, NoisyOracleMatchesPlainDistribution) {
  DSPARK_REAL_MODEL(lm);
  TargetModel& target = *lm.target;
  const auto& prompt = stat_prompt();
  const int64_t V = target.info().vocab;
  // The greedy path and the target's top-4 ids along it: the oracle's q puts
  // its mass on these (one-hot, peaked on the runner-up, or half outside).
  const GenerateResult greedy = generate_plain(target, prompt, spectest::greedy_options(6, {}));
  std::vector<TokenId> seq = prompt;
  seq.insert(seq.end(), greedy.tokens.begin(), greedy.tokens.end());
  KVCache cache = target.new_cache(64);
  const ForwardOut out = target.forward_one(cache, seq, Logits::All);
  std::vector<std::vector<TokenId>> cands;
  for (size_t j = 0; j < greedy.tokens.size(); ++j) {
    const float* row = out.logits.data_ptr<float>() + static_cast<int64_t>(prompt.size() - 1 + j) * V;
    cands.push_back(process_logits(row, V, stat_sampling(1.f, 0)).ids);
  }
  int64_t drafted = 0, accepted = 0;
  const Counts spec = sample_outcomes(samples_per_group(), 3'000'000, [&](int64_t i, uint64_t seed) {
    OracleDrafter oracle(Kind::Noisy, greedy.tokens, static_cast<int64_t>(prompt.size()), V, 0.3,
                         seed);
    oracle.set_candidates(cands);
    oracle.set_conf_range(-1.0, 4.0);
    auto r = generate_speculative(target, oracle, prompt, stat_options(1.f, seed), spec_options(2, i % 2 == 1));
    drafted += r.stats.drafted;
    accepted += r.stats.accepted;
    return r;
  });
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, drafted);
  expect_plain_law(spec, "noisy oracle, acceptance " + std::to_string(accepted) + "/" + std::to_string(drafted));
}

GenerateOptions seed_stable_options(uint64_t seed) {
  GenerateOptions o = stat_options(1.f, seed);
  o.sampling.rule = SamplingRule::SeedStable;
  return o;
}

TEST(SpecSampling, SeedStablePlainMatchesPlainDistribution) {
  // Gumbel-max draws keyed by (seed, position, token) against today's
  // inverse-CDF stream: the same distribution of outputs.
  DSPARK_REAL_MODEL(lm);
  const Counts gumbel = sample_outcomes(samples_per_group(), 5'000'000, [&](int64_t, uint64_t seed) {
    return generate_plain(*lm.target, stat_prompt(), seed_stable_options(seed));
  });
  expect_plain_law(gumbel, "seed-stable plain");
}

TEST(SpecSampling, SeedStableSpeculativeMatchesPlainDistribution) {
  // The coupled verify rule with a random drafter and a noisy oracle (real
  // acceptance), pruning alternating: the plain distribution.
  DSPARK_REAL_MODEL(lm);
  TargetModel& target = *lm.target;
  const Drafter d = spectest::random_drafter(target, SeqHead::Markov);
  const auto& prompt = stat_prompt();
  const GenerateResult greedy = generate_plain(target, prompt, spectest::greedy_options(6, {}));
  int64_t drafted = 0, accepted = 0;
  const Counts spec = sample_outcomes(samples_per_group(), 6'000'000, [&](int64_t i, uint64_t seed) {
    OracleDrafter oracle(Kind::Noisy, greedy.tokens, static_cast<int64_t>(prompt.size()), target.info().vocab, 0.3,
                         seed);
    const DraftModel& dm = i % 2 == 0 ? static_cast<const DraftModel&>(d) : oracle;
    auto r = generate_speculative(target, dm, prompt, seed_stable_options(seed), spec_options(2, i % 4 < 2));
    drafted += r.stats.drafted;
    accepted += r.stats.accepted;
    return r;
  });
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, drafted);
  expect_plain_law(spec, "seed-stable speculative, acceptance " + std::to_string(accepted) + "/" +
                             std::to_string(drafted));
}

TEST(SpecSampling, LookupDraftsMatchPlainDistribution) {
  // Prompt-lookup drafts are one-hot: accepted with probability p(x), a
  // rejection resamples from p without x. On a prompt that repeats itself
  // they fire on most rounds and are accepted only sometimes at T = 1.
  DSPARK_REAL_MODEL(lm);
  TargetModel& target = *lm.target;
  const auto prompt = lm.encode_prompt(
      "The capital of France is Paris. The capital of Italy is Rome. The capital of France is", false);
  const Counts plain = sample_outcomes(samples_per_group(), 7'000'000, [&](int64_t, uint64_t seed) {
    return generate_plain(target, prompt, stat_options(1.f, seed));
  });
  const Drafter d = spectest::random_drafter(target, SeqHead::Markov);
  int64_t drafted = 0, accepted = 0;
  const Counts spec = sample_outcomes(samples_per_group(), 8'000'000, [&](int64_t i, uint64_t seed) {
    SpecOptions so = spec_options(2, false);
    so.lookup.min_ngram = 1;
    so.lookup.max_ngram = 3;
    so.lookup.max_draft = 3;
    // Lookup alone, and next to a drafter (which takes the rounds lookup leaves).
    const DraftModel* dm = i % 2 == 0 ? nullptr : &d;
    SpecSession s(target, dm, prompt, stat_options(1.f, seed), so);
    GenerateResult r = run_session(target, dm, s, so);
    drafted += r.stats.lookup_drafted;
    accepted += r.stats.lookup_accepted;
    return r;
  });
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, drafted);
  const Homogeneity h = homogeneity(plain, spec);
  EXPECT_GT(h.p, 0.001) << h.str() << "; " << describe(plain, spec);
  std::cout << "[ lookup drafts, acceptance " << accepted << "/" << drafted << " ] " << h.str() << "\n";
}

TEST(SpecSampling, BiasedSamplerIsDetected) {
  DSPARK_REAL_MODEL(lm);
  const float t = spectest::full_mode() ? 1.1f : 2.0f;
  const int64_t n = spectest::full_mode() ? samples_per_group() : 100;
  const Counts biased = sample_outcomes(n, 4'000'000, [&](int64_t, uint64_t seed) {
    return generate_plain(*lm.target, stat_prompt(), stat_options(t, seed));
  });
  const Homogeneity h = homogeneity(plain_counts(), biased);
  EXPECT_LT(h.p, 0.001) << "temperature " << t << " vs 1.0 not detected: " << h.str();
  std::cout << "[ T " << t << " vs 1.0 ] " << h.str() << "\n";
}

// ---- KV rollback --------------------------------------------------------------------

std::string max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  if (!a.defined() || !b.defined() || a.sizes() != b.sizes()) return "shape mismatch";
  return "max |diff| " + std::to_string((a - b).abs().max().item<float>());
}

TEST(SpecRollback, TrimmedCacheEqualsFreshPrefill) {
  DSPARK_REAL_MODEL(lm);
  TargetModel& target = *lm.target;
  const int64_t V = target.info().vocab;
  const auto& prompt = spectest::dev_prompt_ids(25);
  const std::vector<TokenId> ref = spectest::reference_continuation(25, 8);
  const TapRequest taps{{1, 7, 14}, false};
  // Block [anchor, x1..x5]: x1, x2 follow the target, x3..x5 do not.
  const std::vector<TokenId> block = {ref[0], ref[1], ref[2], (ref[3] + 1) % static_cast<TokenId>(V),
                                      ref[4], 17};
  // Every trim length; a per-level run (scalar portable: ~4 s each) keeps
  // none, back to the accepted prefix, and all of the block but its anchor.
  const std::vector<int64_t> trims =
      spectest::level_run() && !spectest::full_mode() ? std::vector<int64_t>{0, 3, 5} : std::vector<int64_t>{0, 1, 2, 3, 4, 5};
  for (const int64_t k : trims) {
    KVCache a = target.new_cache();
    target.forward_one(a, prompt, Logits::Last);
    const ForwardOut v = target.forward_one(a, block, Logits::All);
    a.trim(k);
    const int64_t kept = 6 - k;
    const TokenId y = argmax(v.logits.data_ptr<float>() + (kept - 1) * V, V);
    const ForwardOut la = target.forward_one(a, std::vector<TokenId>{y}, Logits::Last, taps);

    std::vector<TokenId> seq = prompt;
    seq.insert(seq.end(), block.begin(), block.begin() + kept);
    seq.push_back(y);
    KVCache b = target.new_cache();
    const ForwardOut lb = target.forward_one(b, seq, Logits::All, taps);
    EXPECT_EQ(a.size(), b.size());
    EXPECT_TRUE(at::equal(la.logits, lb.logits.narrow(0, lb.logits.size(0) - 1, 1)))
        << "trim " << k << ": " << max_abs_diff(la.logits, lb.logits.narrow(0, lb.logits.size(0) - 1, 1));
    EXPECT_TRUE(at::equal(la.taps, lb.taps.narrow(0, lb.taps.size(0) - 1, 1))) << "trim " << k;
    // The verify pass's own logits for the kept prefix equal the fresh pass's.
    EXPECT_TRUE(at::equal(v.logits.narrow(0, 0, kept),
                          lb.logits.narrow(0, static_cast<int64_t>(prompt.size()), kept)))
        << "trim " << k;
  }
}

TEST(SpecRollback, SeveralRoundsThenFreshPrefill) {
  DSPARK_REAL_MODEL(lm);
  TargetModel& target = *lm.target;
  const int64_t V = target.info().vocab;
  const auto& prompt = spectest::dev_prompt_ids(4);
  KVCache a = target.new_cache();
  ForwardOut o = target.forward_one(a, prompt, Logits::Last);
  std::vector<TokenId> emitted;
  TokenId anchor = argmax(o.logits.data_ptr<float>(), V);
  std::mt19937 rng(3);
  for (int64_t reject : {2, 5, 0, 3, 1, 4}) {
    // Verify [anchor, 5 drafts] where the drafts are arbitrary; keep 5 - reject.
    std::vector<TokenId> block = {anchor};
    for (int i = 0; i < 5; ++i) block.push_back(static_cast<TokenId>(rng() % static_cast<uint32_t>(V)));
    const ForwardOut v = target.forward_one(a, block, Logits::All);
    a.trim(reject);
    const int64_t kept = 6 - reject;
    emitted.insert(emitted.end(), block.begin(), block.begin() + kept);
    anchor = argmax(v.logits.data_ptr<float>() + (kept - 1) * V, V);
  }
  const ForwardOut la = target.forward_one(a, std::vector<TokenId>{anchor}, Logits::Last);
  std::vector<TokenId> seq = prompt;
  seq.insert(seq.end(), emitted.begin(), emitted.end());
  seq.push_back(anchor);
  KVCache b = target.new_cache();
  const ForwardOut lb = target.forward_one(b, seq, Logits::Last);
  EXPECT_EQ(a.size(), static_cast<int64_t>(seq.size()));
  EXPECT_TRUE(at::equal(la.logits, lb.logits)) << max_abs_diff(la.logits, lb.logits);
}

}  // namespace

TEST(Sampling, TopKIdsEqualAFullSortsFirstK) {
  // Logits drawn from few distinct values, so ties are common; the kept ids
  // and their order must be those of a stable full sort (descending logit,
  // ascending id), which plain and speculative sampling both rely on.
  std::mt19937 gen(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t V = 1 + static_cast<int64_t>(gen() % 300);
    const int levels = 1 + static_cast<int>(gen() % 12);
    std::vector<float> logits(static_cast<size_t>(V));
    for (float& x : logits) x = static_cast<float>(static_cast<int>(gen() % levels)) * 0.5f - 2.f;
    if (gen() % 4 == 0) logits[gen() % V] = -INFINITY;
    std::vector<TokenId> all(static_cast<size_t>(V));
    std::iota(all.begin(), all.end(), 0);
    std::stable_sort(all.begin(), all.end(), [&](TokenId a, TokenId b) { return logits[a] > logits[b]; });
    for (int64_t k : {int64_t{1}, std::min<int64_t>(2, V), std::max<int64_t>(1, V / 3), V}) {
      const std::vector<TokenId> want(all.begin(), all.begin() + k);
      EXPECT_EQ(top_k_ids(logits.data(), V, k), want) << "V " << V << " k " << k;
    }
  }
  const std::vector<float> hand = {1.f, 3.f, 2.f, 3.f, 0.f};
  EXPECT_EQ(top_k_ids(hand.data(), 5, 3), (std::vector<TokenId>{1, 3, 2}));
  EXPECT_THROW(top_k_ids(hand.data(), 5, 0), InvalidArgument);
  EXPECT_THROW(top_k_ids(hand.data(), 5, 6), InvalidArgument);
}
