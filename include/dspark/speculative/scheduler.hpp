// dspark/speculative/scheduler.hpp — the hardware-aware prefix scheduler of
// DSpark (dspark-method.md §6, Alg. 1): given each request's draft survival
// and the target's throughput curve SPS(B), choose how many draft positions
// of each request the next target call verifies.
//
// Objective: Θ = τ · SPS(B), expected tokens emitted per second, where
// B = R + Σ_r ℓ_r is the number of tokens in the verify batch (each request
// always verifies its anchor) and τ = R + Σ_r Σ_{j<=ℓ_r} a_{r,j} is the
// expected number of emitted tokens (each request emits at least its
// correction/bonus token, plus one per surviving draft position).
//
// Greedy admission with early stop: candidates (r, j) are taken in
// descending a_{r,j} (ties: smaller j first, then smaller r); each is
// admitted while Θ strictly increases, and the FIRST candidate that does not
// increase Θ ends the schedule — no later candidate is considered. The early
// stop is what keeps speculative decoding lossless: whether position j is
// verified depends only on survival estimates of the current draft, never on
// a look-ahead over later positions whose admission could be changed by
// what is sampled (dspark-method.md §6).
#pragma once

#include <cstdint>
#include <vector>

namespace dspark {

/// Target steps per second at `b` verify tokens (SPS curve lookup).
///
/// `sps[i]` is SPS(i + 1), i.e. the curve starts at B = 1. For 1 <= b <=
/// sps.size() the stored value is returned. Past the end the step time
/// t(B) = 1 / SPS(B) is extrapolated linearly with the slope of the last
/// segment of the curve (a least-squares fit over its last quarter, at least
/// two points), clamped to be non-negative, so the curve never rises past its
/// end; a one-point curve is extended as a constant. b < 1 is treated as 1.
/// Throws InvalidArgument when `sps` is empty or holds a value that is not
/// positive and finite.
double sps_at(const std::vector<double>& sps, int64_t b);

/// Outcome of schedule_prefixes().
struct ScheduleResult {
  std::vector<int> lengths;  // ℓ_r: draft positions verified per request (prefix length)
  int64_t batch = 0;         // B = R + Σ ℓ_r: verify tokens in the target call
  double tau = 0.0;          // τ = R + Σ admitted a_{r,j}: expected emitted tokens
  double theta = 0.0;        // Θ = τ · SPS(B): expected tokens per second
};

/// Algorithm 1 of DSpark for R = survival.size() requests.
///
/// `survival[r]` holds a_{r,1..γ_r} (index 0 = draft position 1), the
/// estimated probability that request r's draft prefix up to position j is
/// accepted; each sequence must lie in [0, 1] and be non-increasing in j
/// (violations up to 1e-9 are tolerated and clamped to the running minimum).
/// `sps` is the SPS curve as in sps_at().
///
/// Every request starts at ℓ_r = 0 (B = R, τ = R). Candidates (r, j) are
/// visited in descending a_{r,j}, ties broken by smaller j, then smaller r;
/// a candidate is admitted when (τ + a_{r,j}) · SPS(B + 1) > τ · SPS(B)
/// (strictly), which sets B += 1, τ += a_{r,j}; the first candidate that
/// fails ends the schedule. Because each a_r is non-increasing and ties favour
/// smaller j, the admitted positions of every request form a prefix
/// 1..ℓ_r (checked internally). Consequences: with a flat SPS every candidate
/// with a > 0 is admitted; a steeper SPS gives shorter windows; a candidate
/// with a = 0 is admitted only where SPS increases with B.
///
/// R = 0 gives an empty result (B = 0, τ = 0, Θ = 0). Throws InvalidArgument
/// for an invalid survival sequence or SPS curve.
ScheduleResult schedule_prefixes(const std::vector<std::vector<double>>& survival,
                                 const std::vector<double>& sps);

/// Whether schedule_prefixes could admit any candidate for R requests on
/// `sps`, whatever their survivals: the first candidate it weighs has the
/// highest survival a <= 1, and the early stop rejects it (and so every
/// candidate) unless (R + a)·SPS(R + 1) > R·SPS(R); with a = 1 that is the
/// most any draft could offer. False means drafting this step is wasted work
/// (the server then skips the drafter). R <= 0 gives false. Throws
/// InvalidArgument for an invalid curve.
bool any_draft_can_pay(int64_t R, const std::vector<double>& sps);

/// Algorithm 1 with R = 1: the verify length ℓ in [0, survival.size()] for
/// one request (schedule_prefixes({survival}, sps).lengths[0]). Equivalent to
/// a threshold rule: position j (1-based) is admitted iff every position
/// i <= j satisfies a_i > τ_{i-1} · (SPS(i) / SPS(i + 1) − 1), with
/// τ_{i-1} = 1 + Σ_{m<i} a_m.
int schedule_single(const std::vector<double>& survival, const std::vector<double>& sps);

}  // namespace dspark
