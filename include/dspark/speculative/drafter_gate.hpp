// dspark/speculative/drafter_gate.hpp — whether a sequence's next round
// should run the drafter: the per-sequence fallback that keeps speculative
// decoding from being slower than plain decoding where the drafter does not
// pay on this machine's SPS curve (dspark-method.md §6).
//
// The estimate, from this sequence's drafter rounds so far (n rounds,
// `verified` draft tokens verified, `accepted` accepted, `draft_s` seconds
// spent drafting):
//   tokens per round  = 1 + accepted / n
//   seconds per round = 1 / SPS(1 + round(verified / n)) + draft_s / n
// and the drafter pays when tokens / seconds > SPS(1), a plain step's rate.
//
// Exploration: the first kWarmup rounds always draft. After that a drafter
// that does not pay still drafts once every `period` rounds so that the
// estimate can recover (acceptance changes along a text); the period starts
// at kExploreMin, doubles after each exploration that still does not pay (up
// to kExploreMax), and returns to kExploreMin once the drafter pays again. A
// sequence where the drafter never pays thus spends 4 + log-many drafter
// rounds on it, not one in eight.
#pragma once

#include <cstdint>
#include <vector>

namespace dspark {

class DrafterGate {
 public:
  static constexpr int64_t kWarmup = 4;
  static constexpr int64_t kExploreMin = 8;
  static constexpr int64_t kExploreMax = 64;

  /// `sps`: SPS(1..Bmax) in steps per second (sps_profile.hpp); empty: no
  /// curve, every round drafts.
  explicit DrafterGate(std::vector<double> sps = {}) : sps_(std::move(sps)) {}

  /// Whether the coming round (one the drafter could draft) should draft.
  /// Call once per such round; record() the outcome of a round that drafted.
  bool should_draft();

  /// A drafter round's outcome: `verified` draft tokens verified (>= 0),
  /// `accepted` of them accepted, `draft_s` seconds of drafting.
  void record(int64_t verified, int64_t accepted, double draft_s);

  /// Whether the estimate says the drafter pays (false before any round).
  bool pays() const;

  int64_t rounds() const { return rounds_; }
  int64_t period() const { return period_; }

 private:
  bool draft();  // a drafting answer: the skipped-round count starts again

  std::vector<double> sps_;
  int64_t rounds_ = 0, verified_ = 0, accepted_ = 0;
  double draft_s_ = 0;
  int64_t since_ = 0;  // rounds since the drafter last drafted
  int64_t period_ = kExploreMin;
};

}  // namespace dspark
