// dspark/speculative/verify_policy.hpp — how many drafted positions each target
// call verifies: the one place that applies confidence pruning and DSpark's
// hardware-aware prefix scheduler (dspark-method.md §6), for one request
// (generate, bench) and for many (serve) alike.
//
// Modes, from SpecOptions:
//   off         spec.prune false, no SPS curve: verify every drafted position;
//   thresholds  spec.prune true, no SPS curve: confidence pruning
//               (prune_length; thresholds resolved as SpecOptions documents);
//   sps         spec.sps non-empty: pruning as above when spec.prune, then
//               schedule_prefixes() over every decoding request of the step,
//               on the SPS curve shifted by the step's prefill tokens (B
//               counts every token of the call).
// The CLI resolves `--schedule auto` into one of these (drafter_options.hpp);
// the server's `--sps` picks sps or thresholds.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "dspark/speculative/drafter.hpp"
#include "dspark/speculative/speculative.hpp"

namespace dspark {

class SpecSession;

class VerifyPolicy {
 public:
  enum class Mode { Off, Thresholds, Sps };

  /// `drafter` null: plain decoding (every method is then a no-op), unless
  /// spec.lookup is enabled (lookup drafts: off or sps mode). Lookup drafts
  /// are never pruned by thresholds; the scheduler weighs them by their
  /// running acceptance (SpecSession::survival) and verify at least their first
  /// token, so that the estimate keeps learning.
  VerifyPolicy(const SpecOptions& spec, const DraftModel* drafter);

  Mode mode() const { return mode_; }

  /// Whether drafting this step can pay for `decoding` requests while
  /// `prefill_tokens` prompt tokens share the call: in sps mode,
  /// any_draft_can_pay() on the shifted curve; otherwise true when there is
  /// a decoding request. When false every session skips drafting.
  bool drafting_pays(int64_t decoding, int64_t prefill_tokens) const;

  /// Sets the verify length of every session in `drafted` (each has just
  /// drafted): pruning, then the scheduler across all of them. A degenerate
  /// survival or curve leaves the pruned lengths.
  void plan(std::span<SpecSession* const> drafted, int64_t prefill_tokens) const;

 private:
  Mode mode_ = Mode::Off;
  bool speculative_ = false;
  std::vector<double> thresholds_;          // pruning thresholds (empty: no pruning)
  std::vector<double> prune_temperatures_;  // empty: thresholds apply to σ(z_k)
  std::vector<double> sps_;                 // sps mode: SPS(B), B = 1..size()
  std::vector<double> survival_temperatures_;  // the drafter's STS temperatures
};

}  // namespace dspark
