// The drafter-skip rule; see drafter_gate.hpp.
#include "dspark/speculative/drafter_gate.hpp"

#include <algorithm>
#include <cmath>

#include "dspark/speculative/scheduler.hpp"

namespace dspark {

bool DrafterGate::pays() const {
  if (rounds_ == 0) return false;
  const double n = static_cast<double>(rounds_);
  const double tokens = 1.0 + static_cast<double>(accepted_) / n;
  const auto b = 1 + static_cast<int64_t>(std::lround(static_cast<double>(verified_) / n));
  const double t_round = 1.0 / sps_at(sps_, b) + draft_s_ / n;
  return tokens / t_round > sps_at(sps_, 1);
}

bool DrafterGate::should_draft() {
  if (sps_.empty() || rounds_ < kWarmup) return draft();
  if (pays()) {
    period_ = kExploreMin;
    return draft();
  }
  if (++since_ < period_) return false;
  period_ = std::min(2 * period_, kExploreMax);
  return draft();
}

bool DrafterGate::draft() {
  since_ = 0;
  return true;
}

void DrafterGate::record(int64_t verified, int64_t accepted, double draft_s) {
  ++rounds_;
  verified_ += verified;
  accepted_ += accepted;
  draft_s_ += draft_s;
}

}  // namespace dspark
