// dspark/speculative/runner.hpp — the one driver of SpecSessions: generate and
// bench (one session), regen (many, plain) and serve (many, speculative) all
// step their sessions through a BatchRunner.
//
// One step is ONE ragged target forward call over every live session:
//   1. prefill: sessions still prefilling get a chunk of their prompt, within
//      a per-call budget (chunked prefill, below), shortest remainder first;
//   2. draft: decoding sessions run the drafter, unless the VerifyPolicy
//      says no draft could pay this step (then they verify the anchor only);
//   3. plan: the VerifyPolicy sets every drafted session's verify length;
//   4. forward, then every session consumes its output (emit, stop, budget,
//      full context and rollback are the session's rules).
//
// Chunked prefill. A prompt token at context position c costs about
// 1 + c / L target-row equivalents, where L = prefill_attention_span(info) is
// the context at which one query's attention costs as much as its matmuls
// (per layer: weight multiply-adds / (2 · heads · head_dim ·
// kAttentionSlowdown)). With a budget
// of P equivalents a call carries prompt chunks worth at most P (at least
// one token, so every prefill progresses): a long prompt is prefilled over
// many calls between the other requests' decode steps, so no call — and no
// other request's next token — waits for the whole of it. Chunking never
// changes results: the target's output rows are bitwise the same however a
// sequence's tokens are split into calls.
//
// Budget by time. A fixed budget still makes every step that carries prompt
// work cost several decode steps, and each decoding session waits for every
// such step. Given the SPS curve (time of a call of B rows, t(B) = 1 / SPS(B))
// and a slowdown s, a step in which D sessions decode carries at most the
// prompt work P with t(D + P) <= s · t(D) (timed_prefill_budget): their next
// tokens come at most s times later than without it. With nobody decoding,
// the fixed budget alone applies.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "dspark/speculative/session.hpp"
#include "dspark/speculative/verify_policy.hpp"

namespace dspark {

/// How many times slower attention runs per multiply-add than the matmuls.
/// Measured with SmolLM2-135M (quantized compute, 2 threads): prefilling n
/// tokens takes a·n + b·n²/2 with a/b ≈ 1,175 positions, against 3,072 from
/// the multiply-add counts alone.
inline constexpr int64_t kAttentionSlowdown = 3;

struct RunnerOptions {
  /// Chunked prefill budget per target call, in target-row equivalents (see
  /// above); 0: every prompt goes whole into one call.
  int64_t prefill_budget = 0;
  /// With a budget and a non-empty SPS curve (sps[i] = SPS(i + 1), as in
  /// sps_at()): while sessions decode, a step's prompt work is also bounded
  /// so that the step takes at most `prefill_slowdown` times as long as
  /// their decoding alone (timed_prefill_budget); 0: the fixed budget only.
  std::vector<double> sps = {};
  double prefill_slowdown = 0;
};

/// The prompt work (target-row equivalents) a step in which `decoding`
/// sessions decode may carry: the largest P <= cap for which every
/// P' <= P keeps the step's time by the SPS curve within `slowdown` times
/// that of the decoding alone, t(decoding + P') <= slowdown · t(decoding)
/// with t(B) = 1 / sps_at(sps, B) (a noisy curve that dips again further on
/// does not extend P). `cap` when nobody decodes, the curve is empty or
/// slowdown <= 0. Throws InvalidArgument for a curve value that is not
/// positive and finite.
int64_t timed_prefill_budget(const std::vector<double>& sps, int64_t decoding, double slowdown, int64_t cap);

/// The context length L at which a query's attention costs as much as its
/// share of the layer's matmuls (see the header comment); >= 1.
int64_t prefill_attention_span(const TargetInfo& info);

/// Cost in target-row equivalents of prefilling `n` prompt tokens that
/// follow `context` tokens already in the cache: Σ_{i<n} 1 + (context + i) / span.
double prefill_cost(int64_t n, int64_t context, int64_t span);

class BatchRunner {
 public:
  /// Every session stepped by this runner must have been made with the same
  /// `target` and `drafter` (null: plain decoding); `spec` configures the
  /// verify policy (its gamma and on_round belong to the sessions).
  BatchRunner(TargetModel& target, const DraftModel* drafter, const SpecOptions& spec, RunnerOptions opts = {});

  /// Called for a session whose drafting, forward or consume threw; the
  /// runner has cancelled it. The other sessions of the step proceed.
  using ErrorHandler = std::function<void(SpecSession&, const std::string& message)>;

  /// One step over the unfinished sessions of `sessions`. Returns the tokens
  /// they emitted in it. Without `on_error`, an exception propagates (the
  /// single-request drivers); with it, a failing session is reported and
  /// cancelled (a failed forward call leaves every cache unchanged and is
  /// retried one session at a time to find the one at fault).
  int64_t step(std::span<SpecSession* const> sessions, const ErrorHandler& on_error = {});

  /// Target forward calls made so far.
  int64_t calls() const { return calls_; }
  const VerifyPolicy& policy() const { return policy_; }

 private:
  void forward(std::span<SpecSession* const> batch, const ErrorHandler& on_error);

  TargetModel& target_;
  const DraftModel* drafter_;
  VerifyPolicy policy_;
  RunnerOptions opts_;
  int64_t span_;
  int64_t calls_ = 0;
};

/// Runs one session to its end with a BatchRunner; returns its result.
GenerateResult run_session(TargetModel& target, const DraftModel* drafter, SpecSession& session,
                           const SpecOptions& spec);

}  // namespace dspark
