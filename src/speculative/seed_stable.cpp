// Counter-based noise of seed-stable sampling; see include/dspark/speculative/seed_stable.hpp.
#include "dspark/speculative/seed_stable.hpp"

#include <cmath>
#include <limits>

#include "dspark/error.hpp"

namespace dspark {

std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  // Round multipliers and Weyl key increments of Philox4x32 (Random123).
  constexpr uint64_t kM0 = 0xD2511F53, kM1 = 0xCD9E8D57;
  constexpr uint32_t kW0 = 0x9E3779B9, kW1 = 0xBB67AE85;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = kM0 * c[0], p1 = kM1 * c[2];
    const auto hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const auto hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
    k[0] += kW0;
    k[1] += kW1;
  }
  return c;
}

double noise_uniform(uint64_t seed, int64_t position, TokenId token) {
  const auto pos = static_cast<uint64_t>(position);
  const auto out = philox4x32_10(
      {static_cast<uint32_t>(pos), static_cast<uint32_t>(pos >> 32), static_cast<uint32_t>(token), 0},
      {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
  const uint64_t bits = ((static_cast<uint64_t>(out[0]) << 32) | out[1]) >> 11;  // 53 bits
  return (static_cast<double>(bits) + 0.5) * 0x1.0p-53;
}

double gumbel_noise(uint64_t seed, int64_t position, TokenId token) {
  return -std::log(-std::log(noise_uniform(seed, position, token)));
}

TokenId gumbel_argmax(const Distribution& dist, uint64_t seed, int64_t position) {
  if (dist.ids.empty()) throw InvalidArgument("gumbel_argmax: the distribution is empty");
  TokenId best = dist.ids[0];
  double best_key = -std::numeric_limits<double>::infinity();
  bool found = false;
  for (size_t i = 0; i < dist.ids.size(); ++i) {
    const double p = dist.probs[i];
    if (!(p > 0)) continue;  // zero, negative or NaN: outside the support
    const double key = std::log(p) + gumbel_noise(seed, position, dist.ids[i]);
    if (!found || key > best_key || (key == best_key && dist.ids[i] < best)) {
      best = dist.ids[i];
      best_key = key;
      found = true;
    }
  }
  return best;
}

}  // namespace dspark
