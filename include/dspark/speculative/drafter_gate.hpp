// dspark/speculative/drafter_gate.hpp — whether a sequence's next round
// should run the drafter: the per-sequence fallback that keeps speculative
// decoding from being slower than plain decoding where the drafter does not
// pay on this machine (dspark-method.md §6).
//
// The estimate, from this sequence's drafter rounds so far (n rounds,
// `verified` draft tokens verified, `accepted` accepted, `draft_s` and
// `verify_s` seconds spent drafting and verifying):
//   tokens per round  = 1 + accepted / n
//   seconds per round = (draft_s + verify_s) / n              measured, or
//                     = 1 / SPS(1 + round(verified / n)) + draft_s / n
// and the drafter pays when tokens / seconds beats a plain step's rate: the
// measured mean of the sequence's rounds that drafted nothing (a one-token
// forward) once there are kMinPlain of them, with the measured round time;
// SPS(1) with the curve's round time before that. Measured times keep the
// decision right where the saved SPS curve is not (another load on the
// machine, a context longer or shorter than the profile's, wake-ups between
// short steps that the profile's back-to-back calls do not see).
//
// Exploration: the first kWarmup rounds always draft. After that a drafter
// that does not pay still drafts once every `period` rounds so that the
// estimate can recover (acceptance changes along a text); the period starts
// at kExploreMin, doubles after each exploration that still does not pay (up
// to kExploreMax), and returns to kExploreMin once the drafter pays again. A
// sequence where the drafter never pays thus spends 4 + log-many drafter
// rounds on it, not one in eight. A drafter that pays before any plain step
// has been timed skips one round in kProbePeriod to time one.
//
// Memory across sequences (DrafterGateMemory, optional): the sessions of one
// process that share a memory start from what earlier sequences of the same
// sampling regime (greedy or sampled) measured. Their rounds count as up to
// kPriorRounds pseudo-rounds of this sequence's estimate (and their plain
// steps as up to kPriorRounds timed steps), so a sequence needs no warm-up
// once the memory holds kWarmup rounds, and the exploration period starts
// where the memory's left off: where the drafter does not pay in that regime
// (a small drafter under sampling), a new sequence spends one or two rounds
// on it instead of four to eight.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace dspark {

/// Drafter rounds and plain steps of earlier sequences, per sampling regime:
/// sums decayed by half whenever their count passes kMemoryRounds (recent
/// rounds weigh most), and the exploration period reached. Thread-safe;
/// shared by the sessions of one generate, bench or serve
/// (SpecOptions::gate_memory).
class DrafterGateMemory {
 public:
  static constexpr double kMemoryRounds = 64;
  struct Stats {
    double rounds = 0, verified = 0, accepted = 0, draft_s = 0, verify_s = 0;  // drafter rounds
    double plain = 0, plain_s = 0;  // rounds that drafted nothing, and their seconds
    int64_t period = 0;             // 0: none reached yet
  };
  Stats get(bool sampled) const;
  void record(bool sampled, int64_t verified, int64_t accepted, double draft_s, double verify_s);
  void record_plain(bool sampled, double seconds);
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
  static constexpr int64_t kProbePeriod = 16;
  static constexpr double kPriorRounds = 8;
  static constexpr double kMinPlain = 4;

  /// `sps`: SPS(1..Bmax) in steps per second (sps_profile.hpp); empty: no
  /// curve, every round drafts. `memory` (may be null): rounds of earlier
  /// sequences, read for the regime `sampled` and updated by record().
  explicit DrafterGate(std::vector<double> sps = {}, std::shared_ptr<DrafterGateMemory> memory = nullptr,
                       bool sampled = false);

  /// Whether the coming round (one the drafter could draft) should draft.
  /// Call once per such round; record() the outcome of a round that drafted.
  bool should_draft();

  /// A drafter round's outcome: `verified` draft tokens verified (>= 0),
  /// `accepted` of them accepted, `draft_s` seconds of drafting, `verify_s`
  /// seconds of its forward (0: not measured; the curve prices the round).
  void record(int64_t verified, int64_t accepted, double draft_s, double verify_s = 0);
  /// A round that drafted nothing took `seconds` (a plain step).
  void record_plain(double seconds);

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
  double draft_s_ = 0, verify_s_ = 0;
  int64_t timed_rounds_ = 0;  // drafter rounds with a measured verify
  int64_t plain_ = 0;
  double plain_s_ = 0;
  int64_t since_ = 0;  // rounds since the drafter last drafted
  int64_t probe_ = 0;  // paying rounds since the last one skipped to time a plain step
  int64_t period_ = kExploreMin;
};

}  // namespace dspark
