// dspark/spec/session.hpp — one generation as a step-wise state machine, so
// that many requests can share each target forward call (batched serving)
// and a scheduler can choose each request's verify length between drafting
// and verification.
//
// Life cycle (single request: generate_plain / generate_speculative; many:
// the server):
//   while (!s.finished()) {
//     s.draft();                       // drafter pass (no-op while prefilling / plain)
//     s.set_verify_length(ell);        // optional: shorten the block (scheduler)
//     ForwardSeq f = s.forward_input();// prompt (prefill) or [anchor, x_1..x_ell]
//     ... target.forward({f, ...}, s.taps()) ...
//     s.consume(out);                  // accept / resample / emit / roll back
//   }
// Each round emits the accepted drafts plus one target token; output is
// lossless (see speculative.hpp).
#pragma once

#include <memory>
#include <vector>

#include "dspark/spec/speculative.hpp"

namespace dspark {

class SpecSession {
 public:
  /// `drafter` may be null: plain decoding (one token per target call).
  /// Throws InvalidArgument for invalid sampling parameters, a prompt that
  /// does not fit the context, or a drafter built for another target.
  SpecSession(TargetModel& target, const DraftModel* drafter, std::vector<TokenId> prompt,
              GenerateOptions opts, SpecOptions spec = {});
  ~SpecSession();
  SpecSession(SpecSession&&) noexcept;
  SpecSession& operator=(SpecSession&&) noexcept;

  bool finished() const;
  /// Runs the drafter for the coming round (no-op before prefill, for plain
  /// decoding, or when the token budget leaves no room to draft).
  void draft();
  /// Prepares a round without drafting: the next target call verifies the
  /// anchor only (a plain decoding step). Used when drafting cannot pay.
  void skip_draft();
  /// Raw confidence logits z_k of the current draft ([g], empty when none).
  const std::vector<float>& conf_logits() const;
  /// Verify length after confidence pruning (0: verify the anchor only).
  int max_verify() const;
  /// Shortens the verify length to `ell` (clamped to [0, max_verify()]).
  void set_verify_length(int ell);
  /// The next target call for this sequence. Valid until consume().
  ForwardSeq forward_input();
  /// Processes the target's output for forward_input(): prefill picks the
  /// first token; a round accepts, resamples and emits tokens, then rolls the
  /// KV cache back by the rejected count.
  void consume(const ForwardOut& out);
  /// Taps the target must return for this session (empty for plain).
  const TapRequest& taps() const;
  /// Ends generation now (e.g. the client went away).
  void cancel();

  GenerateResult& result();
  const GenerateResult& result() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dspark
