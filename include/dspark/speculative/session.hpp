// dspark/speculative/session.hpp — one generation as a step-wise state machine, so
// that many requests can share each target forward call (batched serving)
// and a policy can choose each request's verify length between drafting
// and verification. BatchRunner (runner.hpp) drives sessions; the stop,
// budget and full-context rules live here alone.
//
// Life cycle:
//   while (!s.finished()) {
//     s.set_prefill_chunk(n);          // optional while prefilling: chunked prefill
//     s.draft();                       // drafter pass (no-op while prefilling / plain)
//     s.set_verify_length(ell);        // optional: shorten the block (VerifyPolicy)
//     ForwardSeq f = s.forward_input();// a prompt chunk or [anchor, x_1..x_ell]
//     ... target.forward({f, ...}, s.taps()) ...
//     s.consume(out);                  // accept / resample / emit / roll back
//   }
// Each round emits the accepted drafts plus one target token; output is
// lossless (see speculative.hpp). Under SamplingRule::SeedStable the tokens
// are the plain-sampled ones of the seed whatever the drafts and verify
// lengths, so also whatever shares the batch.
#pragma once

#include <memory>
#include <vector>

#include "dspark/speculative/speculative.hpp"

namespace dspark {

class SpecSession {
 public:
  /// `drafter` may be null: plain decoding (one token per target call), or
  /// lookup drafts alone when spec.lookup is enabled.
  /// Throws InvalidArgument for invalid sampling parameters, a prompt that
  /// does not fit the context, or a drafter built for another target.
  SpecSession(TargetModel& target, const DraftModel* drafter, std::vector<TokenId> prompt,
              GenerateOptions opts, SpecOptions spec = {});
  ~SpecSession();
  SpecSession(SpecSession&&) noexcept;
  SpecSession& operator=(SpecSession&&) noexcept;

  bool finished() const;
  /// True until the whole prompt has been through the target.
  bool prefilling() const;
  /// Prompt tokens already in the KV cache / still to prefill.
  int64_t prefilled_tokens() const;
  int64_t prefill_remaining() const;
  /// Chunked prefill: the next forward_input() carries at most `n` prompt
  /// tokens (clamped to [1, prefill_remaining()]; default: all of them).
  /// Only the call with the prompt's last token produces logits.
  void set_prefill_chunk(int64_t n);
  /// Runs the drafter for the coming round (no-op while prefilling, for
  /// plain decoding, or when the token budget leaves no room to draft). The
  /// verify length is then the drafted length.
  void draft();
  /// Prepares a round without drafting: the next target call verifies the
  /// anchor only (a plain decoding step). Used when drafting cannot pay.
  void skip_draft();
  /// Raw confidence logits z_k of the current draft ([g], empty when none);
  /// for a lookup draft, the logits of its running acceptance estimates.
  const std::vector<float>& conf_logits() const;
  /// Whether the current draft came from prompt lookup (SpecOptions::lookup).
  bool lookup_round() const;
  /// Estimated survival of the current draft, â_k = P(positions 0..k all
  /// accepted) ([g]): for a drafter draft calibrated_survival(conf_logits(),
  /// temperatures); for a lookup draft the product of this sequence's
  /// per-position lookup acceptance so far (shrunk towards the pooled rate).
  std::vector<double> survival(const std::vector<double>& temperatures) const;
  /// The current verify length (0: verify the anchor only): the drafted
  /// length until set_verify_length() shortens it.
  int max_verify() const;
  /// Shortens the verify length to `ell` (clamped to [0, max_verify()]).
  void set_verify_length(int ell);
  /// The next target call for this sequence. Valid until consume().
  ForwardSeq forward_input();
  /// Processes the target's output for forward_input(): the last prefill
  /// chunk picks the first token; a round accepts, resamples and emits
  /// tokens, then rolls the KV cache back by the rejected count.
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
