// dspark/speculative/stats.hpp — the figures of one generation (plain or
// speculative), apart from the decoding code so that readers of them (the
// server's response building) need no model.
#pragma once

#include <cstdint>
#include <vector>

namespace dspark {

/// Figures of one generation. Times are seconds.
struct GenerateStats {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  double prefill_s = 0;
  double decode_s = 0;  // from the end of prefill to the last token
  int64_t target_calls = 0;  // target forward calls after prefill
  // Speculative decoding only (zero for plain decoding).
  int64_t drafted = 0;
  int64_t accepted = 0;
  int64_t rounds = 0;
  int64_t lookup_rounds = 0;    // rounds drafted by prompt lookup (lookup.hpp)
  int64_t drafter_rounds = 0;   // rounds drafted by the drafter (the rest drafted nothing: drafter_gate.hpp)
  int64_t lookup_drafted = 0;
  int64_t lookup_accepted = 0;
  double draft_s = 0;
  double verify_s = 0;
  std::vector<int64_t> reached_by_position;   // [γ] rounds whose draft reached position k
  std::vector<int64_t> accepted_by_position;  // [γ] rounds that accepted position k

  double prefill_tok_s() const { return prefill_s > 0 ? prompt_tokens / prefill_s : 0; }
  /// Tokens per second after the first (which the prefill call produces); 0
  /// when fewer than 2 tokens were generated.
  double decode_tok_s() const { return decode_s > 0 ? static_cast<double>(decode_tokens()) / decode_s : 0; }
  /// Tokens the decode phase produced: all but the first, which the prefill
  /// forward gives (its time is prefill_s).
  int64_t decode_tokens() const { return generated_tokens > 1 ? generated_tokens - 1 : 0; }
  /// τ: tokens emitted per target call (each round emits accepted + 1).
  double tau() const;
  /// Conditional acceptance per draft position: accepted at k / rounds that
  /// reached k, for the positions some round reached (0 .. the longest draft
  /// - 1; empty when nothing was drafted).
  std::vector<double> acceptance_by_position() const;
  /// Adds another generation's figures: counts, times and per-position
  /// counts (the longer of the two position vectors) summed.
  GenerateStats& operator+=(const GenerateStats& o);
};

}  // namespace dspark
