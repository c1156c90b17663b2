// Verify lengths: pruning and the prefix scheduler; see include/dspark/speculative/verify_policy.hpp.
#include "dspark/speculative/verify_policy.hpp"

#include <algorithm>

#include "dspark/speculative/scheduler.hpp"
#include "dspark/speculative/session.hpp"

namespace dspark {

VerifyPolicy::VerifyPolicy(const SpecOptions& spec, const DraftModel* drafter)
    : speculative_(drafter != nullptr || spec.lookup.enabled()) {
  if (!speculative_) return;
  mode_ = !spec.sps.empty() ? Mode::Sps : spec.prune && drafter ? Mode::Thresholds : Mode::Off;
  sps_ = spec.sps;
  if (!drafter) return;
  survival_temperatures_ = drafter->calibrated_temperatures();
  if (!spec.prune) return;
  // Checkpoint thresholds are on calibrated survival when the checkpoint
  // holds STS temperatures; explicit thresholds stay on per-position
  // confidence.
  const int gamma = spec.gamma > 0 ? spec.gamma : drafter->gamma();
  if (spec.min_conf >= 0) {
    thresholds_.assign(static_cast<size_t>(std::max(gamma, 0)), spec.min_conf);
  } else if (spec.thresholds) {
    thresholds_ = *spec.thresholds;
  } else {
    thresholds_ = drafter->calibrated_thresholds();
    prune_temperatures_ = survival_temperatures_;
  }
}

namespace {
// SPS as seen by the decode tokens of a call that also carries `prefill` tokens.
std::vector<double> shifted_curve(const std::vector<double>& sps, size_t n, int64_t prefill) {
  std::vector<double> curve;
  curve.reserve(n);
  for (size_t b = 1; b <= n; ++b) curve.push_back(sps_at(sps, static_cast<int64_t>(b) + prefill));
  return curve;
}
}  // namespace

bool VerifyPolicy::drafting_pays(int64_t decoding, int64_t prefill_tokens) const {
  if (!speculative_ || decoding <= 0) return false;
  if (mode_ != Mode::Sps) return true;
  return any_draft_can_pay(decoding, shifted_curve(sps_, static_cast<size_t>(decoding) + 1, prefill_tokens));
}

void VerifyPolicy::plan(std::span<SpecSession* const> drafted, int64_t prefill_tokens) const {
  if (!speculative_ || drafted.empty()) return;
  if (!thresholds_.empty())
    for (SpecSession* s : drafted)
      if (!s->lookup_round()) s->set_verify_length(prune_length(s->conf_logits(), thresholds_, prune_temperatures_));
  if (mode_ != Mode::Sps) return;
  std::vector<std::vector<double>> survival;
  size_t candidates = 0;
  for (SpecSession* s : drafted) {
    std::vector<double> a = s->survival(survival_temperatures_);
    a.resize(std::min<size_t>(a.size(), static_cast<size_t>(s->max_verify())));
    candidates += a.size();
    survival.push_back(std::move(a));
  }
  try {
    const ScheduleResult r =
        schedule_prefixes(survival, shifted_curve(sps_, drafted.size() + candidates, prefill_tokens));
    // A lookup round verifies at least its first token: its acceptance
    // estimate learns only from verified positions, and would otherwise
    // stay at the first low value it reached (one more row per call).
    for (size_t i = 0; i < drafted.size(); ++i)
      drafted[i]->set_verify_length(drafted[i]->lookup_round() ? std::max(r.lengths[i], 1) : r.lengths[i]);
  } catch (const std::exception&) {
    // A degenerate survival or curve: verify what pruning left.
  }
}

}  // namespace dspark
