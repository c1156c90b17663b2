// dspark/speculative/speculative.hpp — lossless speculative decoding with a DSpark
// drafter (dspark-method.md §5-6).
//
// Each round: the drafter proposes up to γ tokens after the anchor; low-
// confidence tails are pruned; the target verifies [anchor, x_1..x_ℓ] in ONE
// forward pass; the longest acceptable prefix is kept plus one target token
// (correction or bonus); rejected KV entries are trimmed; the accepted
// tokens' tapped features extend the drafter's context.
//
// Acceptance: greedy — x_k is accepted while it equals the target argmax;
// sampling — x_k is accepted with probability min(1, p_k(x_k)/q_k(x_k)), at
// the first rejection the correction is drawn from norm(max(0, p_k - q_k)),
// and after a fully accepted block the bonus is drawn from p_{ℓ+1} (the
// rejection rule); under SamplingRule::SeedStable x_k is accepted while it
// equals the target's own Gumbel-max token of that position (sampling.hpp).
// p and q are the same processed distributions (temperature, top-k, top-p,
// min-p). The output equals plain decoding token for token (greedy and
// seed-stable) and in distribution (rejection).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "dspark/speculative/drafter.hpp"
#include "dspark/speculative/drafter_gate.hpp"
#include "dspark/speculative/generate.hpp"
#include "dspark/speculative/lookup.hpp"

namespace dspark {

/// Receives, per verified draft position of a round: position k (0-based),
/// the raw confidence logit z_k, and whether positions 0..k were all
/// accepted (prefix survival). Used by calibration.
using RoundCallback = std::function<void(int position, float conf_logit, bool survived)>;

struct SpecOptions {
  int gamma = 0;  // block size; 0 = the drafter's γ
  /// Confidence pruning. Thresholds resolve as: `thresholds` when set >
  /// the drafter checkpoint's calibration > none; `min_conf` >= 0 overrides
  /// every position with one value; `prune` false disables pruning.
  /// Checkpoint thresholds apply to the calibrated survival when the
  /// checkpoint also holds STS temperatures; explicit `thresholds` and
  /// `min_conf` always apply to the per-position confidence σ(z_k).
  bool prune = true;
  std::optional<std::vector<double>> thresholds;
  double min_conf = -1.0;
  /// Hardware-aware scheduling (dspark-method.md §6, Alg. 1 with R = 1):
  /// when non-empty, SPS(B) in target steps per second for B = 1..size()
  /// verify tokens (sps[B-1]); after drafting (and pruning, if on) the verify
  /// length is cut to schedule_single() of the calibrated survival.
  std::vector<double> sps;
  /// The curve the drafter-skip rule (drafter_gate.hpp) prices rounds on
  /// when `sps` is empty (confidence pruning alone): same units as `sps`;
  /// ignored when `sps` is set, which the rule then uses. Both empty: every
  /// round drafts (`--schedule off`, the mode that measures τ).
  std::vector<double> gate_sps;
  /// Prompt-lookup drafts (lookup.hpp): when enabled, a round whose history
  /// holds a match drafts from it (up to lookup.max_draft tokens, never
  /// pruned by the drafter's thresholds); other rounds use the drafter. With
  /// no drafter, lookup drafts alone make decoding speculative.
  LookupOptions lookup;
  /// Called for drafter rounds only (lookup rounds have no confidence head).
  RoundCallback on_round;
  /// What the drafter-skip rule learned from earlier sequences
  /// (drafter_gate.hpp); sessions given the same memory share it. Null:
  /// every sequence starts afresh.
  std::shared_ptr<DrafterGateMemory> gate_memory;
};

/// Speculative generation. Same contract and errors as generate_plain, plus
/// InvalidArgument when the drafter was built for another target.
GenerateResult generate_speculative(TargetModel& target, const DraftModel& drafter,
                                    const std::vector<TokenId>& prompt, const GenerateOptions& opts,
                                    const SpecOptions& spec);

/// Number of draft positions kept by confidence pruning: the first k >= 1
/// with sigmoid(conf_logits[k]) < thresholds[k] cuts the block to k
/// (position 0 is always kept). Missing thresholds (past the list's end)
/// keep the position. Empty thresholds keep everything.
int prune_length(const std::vector<float>& conf_logits, const std::vector<double>& thresholds);

/// Confidence pruning on calibrated survival (dspark-method.md §6, STS):
/// with `temperatures` empty this is prune_length(conf_logits, thresholds);
/// otherwise the first k >= 1 with â_k < thresholds[k] cuts the block to k,
/// where â_k = ∏_{i<=k} σ(conf_logits[i] / T_i) and T_i = temperatures[i]
/// (1 past the list's end). Position 0 is always kept; missing thresholds
/// keep the position.
int prune_length(const std::vector<float>& conf_logits, const std::vector<double>& thresholds,
                 const std::vector<double>& temperatures);

/// Probability of accepting draft token `x` drawn from q:
/// min(1, p(x) / max(q(x), 1e-8)); 0 when q holds a non-finite or negative
/// probability (a diverged drafter), so that such a draft is always rejected.
double accept_probability(const Distribution& p, const Distribution& q, TokenId x);

/// Speculative-sampling verification of one draft token: accept when
/// u < accept_probability(p, q, x), u uniform in [0, 1).
bool accept_token(const Distribution& p, const Distribution& q, TokenId x, double u);

/// The residual distribution norm(max(0, p - q)); falls back to p when the
/// residual mass is below 1e-9 or q is unusable (see accept_probability), so
/// the emitted token is always distributed as p.
Distribution residual(const Distribution& p, const Distribution& q);

}  // namespace dspark
