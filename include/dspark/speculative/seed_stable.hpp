// dspark/speculative/seed_stable.hpp — the noise of seed-stable sampling
// (dspark-method.md §5, "Gumbel-max coupling").
//
// Every sampled position t of a sequence draws its randomness from a
// counter-based generator keyed by (seed, t, token), not from a stream: the
// token at t is argmax_v (log p_t(v) + g(seed, t, v)) with g Gumbel(0, 1)
// noise, an exact sample of p_t whose value does not depend on how many
// random numbers were used before. A drafter that proposes
// argmax_v (log q_t(v) + g(seed, t, v)) with the same noise agrees with the
// target exactly when the two argmaxes coincide; verification accepts while
// they do, so the output is the plain-sampled sequence whatever the drafts.
#pragma once

#include <array>
#include <cstdint>

#include "dspark/speculative/sampling.hpp"

namespace dspark {

/// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
/// 3", SC 2011; the generator of Random123, cuRAND and JAX): the 128-bit
/// output block for a 128-bit counter and a 64-bit key.
std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

/// Uniform in (0, 1) for (seed, position, token): key = seed, counter =
/// (position low 32 bits, position high 32 bits, token, 0); the first two
/// output words give 53 bits u, and the result is (u + 0.5) · 2^-53 (never
/// 0 or 1). `position` is the token's absolute position in its sequence
/// (prompt included, 0-based).
double noise_uniform(uint64_t seed, int64_t position, TokenId token);

/// Gumbel(0, 1) noise -log(-log U) with U = noise_uniform(seed, position, token).
double gumbel_noise(uint64_t seed, int64_t position, TokenId token);

/// argmax over the support of `dist` of log(prob) + gumbel_noise(seed,
/// position, id): an exact sample of `dist` (ties: the smaller id; entries
/// of probability 0 or below never win unless every entry has one). Throws
/// InvalidArgument for an empty distribution.
TokenId gumbel_argmax(const Distribution& dist, uint64_t seed, int64_t position);

}  // namespace dspark
