// The drafter-skip rule; see drafter_gate.hpp.
#include "dspark/speculative/drafter_gate.hpp"

#include <algorithm>
#include <cmath>

#include "dspark/speculative/scheduler.hpp"

namespace dspark {

namespace {
// The drafter-round sums scaled by f (decay, or a prior's weight).
void scale_rounds(DrafterGateMemory::Stats& s, double f) {
  s.rounds *= f;
  s.verified *= f;
  s.accepted *= f;
  s.draft_s *= f;
  s.verify_s *= f;
}
void scale_plain(DrafterGateMemory::Stats& s, double f) {
  s.plain *= f;
  s.plain_s *= f;
}
}  // namespace

DrafterGateMemory::Stats DrafterGateMemory::get(bool sampled) const {
  std::lock_guard<std::mutex> lock(mu_);
  return s_[sampled ? 1 : 0];
}

void DrafterGateMemory::record(bool sampled, int64_t verified, int64_t accepted, double draft_s, double verify_s) {
  std::lock_guard<std::mutex> lock(mu_);
  Stats& s = s_[sampled ? 1 : 0];
  s.rounds += 1;
  s.verified += static_cast<double>(verified);
  s.accepted += static_cast<double>(accepted);
  s.draft_s += draft_s;
  s.verify_s += verify_s;
  if (s.rounds > kMemoryRounds) scale_rounds(s, 0.5);
}

void DrafterGateMemory::record_plain(bool sampled, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  Stats& s = s_[sampled ? 1 : 0];
  s.plain += 1;
  s.plain_s += seconds;
  if (s.plain > kMemoryRounds) scale_plain(s, 0.5);
}

void DrafterGateMemory::set_period(bool sampled, int64_t period) {
  std::lock_guard<std::mutex> lock(mu_);
  s_[sampled ? 1 : 0].period = period;
}

DrafterGate::DrafterGate(std::vector<double> sps, std::shared_ptr<DrafterGateMemory> memory, bool sampled)
    : sps_(std::move(sps)), memory_(std::move(memory)), sampled_(sampled) {
  if (!memory_) return;
  prior_ = memory_->get(sampled_);
  if (prior_.rounds > kPriorRounds) scale_rounds(prior_, kPriorRounds / prior_.rounds);
  if (prior_.plain > kPriorRounds) scale_plain(prior_, kPriorRounds / prior_.plain);
  if (prior_.period > 0) period_ = std::clamp(prior_.period, kExploreMin, kExploreMax);
}

bool DrafterGate::pays() const {
  const double n = static_cast<double>(rounds_) + prior_.rounds;
  if (n <= 0) return false;
  const double tokens = 1.0 + (static_cast<double>(accepted_) + prior_.accepted) / n;
  const double draft_s = (draft_s_ + prior_.draft_s) / n;
  const double plain = static_cast<double>(plain_) + prior_.plain;
  // Measured round times where every drafter round so far was timed and
  // plain steps have been timed too; the curve otherwise.
  const bool measured = plain >= kMinPlain && timed_rounds_ == rounds_ && (verify_s_ + prior_.verify_s) > 0;
  if (measured) {
    const double t_round = draft_s + (verify_s_ + prior_.verify_s) / n;
    const double t_plain = (plain_s_ + prior_.plain_s) / plain;
    return tokens / t_round > 1.0 / t_plain;
  }
  const auto b = 1 + static_cast<int64_t>(std::lround((static_cast<double>(verified_) + prior_.verified) / n));
  const double t_round = 1.0 / sps_at(sps_, b) + draft_s;
  return tokens / t_round > sps_at(sps_, 1);
}

bool DrafterGate::should_draft() {
  if (sps_.empty() || static_cast<double>(rounds_) + prior_.rounds < static_cast<double>(kWarmup)) return draft();
  if (pays()) {
    if (period_ != kExploreMin && memory_) memory_->set_period(sampled_, kExploreMin);
    period_ = kExploreMin;
    // No plain step timed yet: skip one round now and then to time one.
    if (static_cast<double>(plain_) + prior_.plain < kMinPlain && ++probe_ >= kProbePeriod) {
      probe_ = 0;
      return false;
    }
    return draft();
  }
  if (++since_ < period_) return false;
  period_ = std::min(2 * period_, kExploreMax);
  if (memory_) memory_->set_period(sampled_, period_);
  return draft();
}

bool DrafterGate::draft() {
  since_ = 0;
  return true;
}

void DrafterGate::record(int64_t verified, int64_t accepted, double draft_s, double verify_s) {
  ++rounds_;
  verified_ += verified;
  accepted_ += accepted;
  draft_s_ += draft_s;
  verify_s_ += verify_s;
  if (verify_s > 0) ++timed_rounds_;
  if (memory_) memory_->record(sampled_, verified, accepted, draft_s, verify_s);
}

void DrafterGate::record_plain(double seconds) {
  ++plain_;
  plain_s_ += seconds;
  if (memory_) memory_->record_plain(sampled_, seconds);
}

}  // namespace dspark
