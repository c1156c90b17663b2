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
//
// Memory across sequences (DrafterGateMemory, optional): the sessions of one
// process that share a memory start from what earlier sequences of the same
// sampling regime (greedy or sampled) measured. Their rounds count as up to
// kPriorRounds pseudo-rounds of this sequence's estimate, so a sequence
// needs no warm-up once the memory holds kWarmup rounds, and the exploration
// period starts where the memory's left off: where the drafter does not pay
// in that regime (a small drafter under sampling), a new sequence spends one
// or two rounds on it instead of four to eight.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace dspark {

/// Drafter rounds of earlier sequences, per sampling regime: sums decayed
/// by half whenever they pass kMemoryRounds rounds (recent rounds weigh
/// most), and the exploration period reached. Thread-safe; shared by the
/// sessions of one generate, bench or serve (SpecOptions::gate_memory).
class DrafterGateMemory {
 public:
  static constexpr double kMemoryRounds = 64;
  struct Stats {
    double rounds = 0, verified = 0, accepted = 0, draft_s = 0;
    int64_t period = 0;  // 0: none reached yet
  };
  Stats get(bool sampled) const;
  void record(bool sampled, int64_t verified, int64_t accepted, double draft_s);
  void set_period(bool sampled, int64_t period);

 private:
  mutable std::mutex mu_;
  Stats s_[2];  // greedy, sampled
};

class DrafterGate {
 public:
  static constexpr int64_t kWarmup = 4;
  static constexpr int64_t kExploreMin = 8;
  static constexpr int64_t kExploreMax = 64;
  static constexpr double kPriorRounds = 8;

  /// `sps`: SPS(1..Bmax) in steps per second (sps_profile.hpp); empty: no
  /// curve, every round drafts. `memory` (may be null): rounds of earlier
  /// sequences, read for the regime `sampled` and updated by record().
  explicit DrafterGate(std::vector<double> sps = {}, std::shared_ptr<DrafterGateMemory> memory = nullptr,
                       bool sampled = false);

  /// Whether the coming round (one the drafter could draft) should draft.
  /// Call once per such round; record() the outcome of a round that drafted.
  bool should_draft();

  /// A drafter round's outcome: `verified` draft tokens verified (>= 0),
  /// `accepted` of them accepted, `draft_s` seconds of drafting.
  void record(int64_t verified, int64_t accepted, double draft_s);

  /// Whether the estimate (this sequence's rounds and the memory's prior)
  /// says the drafter pays (false before any round).
  bool pays() const;

  int64_t rounds() const { return rounds_; }
  int64_t period() const { return period_; }

 private:
  bool draft();  // a drafting answer: the skipped-round count starts again

  std::vector<double> sps_;
  std::shared_ptr<DrafterGateMemory> memory_;
  bool sampled_ = false;
  DrafterGateMemory::Stats prior_;  // the memory when the sequence started, scaled to <= kPriorRounds
  int64_t rounds_ = 0, verified_ = 0, accepted_ = 0;
  double draft_s_ = 0;
  int64_t since_ = 0;  // rounds since the drafter last drafted
  int64_t period_ = kExploreMin;
};

}  // namespace dspark
