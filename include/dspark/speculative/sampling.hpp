// dspark/speculative/sampling.hpp — logits processing and token sampling.
//
// One documented processing order, shared by plain decoding, the drafter and
// speculative verification (which must process p and q identically):
//   1. temperature: logits / T            (T <= 0 means greedy: argmax)
//   2. top-k: keep the k largest logits   (k <= 0 or k >= V: keep all)
//   3. softmax over what is kept
//   4. top-p: keep the smallest prefix, by descending probability, whose mass
//      reaches p                           (p >= 1: keep all)
//   5. min-p: keep tokens whose probability is >= min_p * the largest
//                                          (min_p <= 0: keep all)
//   6. renormalize.
// Ties are broken by the smaller token id everywhere, so results are
// deterministic. Arithmetic is fp32 (softmax accumulates in double).
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace dspark {

using TokenId = int32_t;

/// How sampled tokens are drawn and sampled drafts verified
/// (dspark-method.md §5; docs/sampling.md compares the two).
enum class SamplingRule {
  /// One random stream per generation (Rng): tokens by inverse CDF; a draft
  /// token x ~ q is accepted with probability min(1, p(x)/q(x)) and a
  /// rejection resamples from norm(max(0, p - q)). The best acceptance
  /// (1 - TV(p, q)), but the text depends on where rounds start: γ, pruning,
  /// the scheduler and, in a server, the other requests.
  Rejection,
  /// Seed-stable (Gumbel-max coupling, seed_stable.hpp): the token at
  /// absolute position t is argmax_v log p_t(v) + g(seed, t, v); the drafter
  /// proposes argmax_v log q_t(v) + g(seed, t, v) with the same noise, and a
  /// draft token is accepted iff it equals the target's. The text is a
  /// function of (model, prompt, sampling parameters, seed) alone.
  SeedStable,
};

/// "rejection" | "seed-stable".
const char* to_string(SamplingRule r);

/// The rule of a generation that names no seed (the server's requests
/// without "seed", generate without --seed): the one with the better
/// measured acceptance (docs/sampling.md). Naming a seed asks for
/// seed-stable text.
inline constexpr SamplingRule kUnseededRule = SamplingRule::Rejection;

/// The most alternatives per token a generation may report with its
/// log-probabilities (GenerateOptions::top_logprobs; OpenAI's limit).
inline constexpr int kMaxTopLogprobs = 20;

/// Sampling parameters (llama.cpp's names and defaults).
struct SamplingParams {
  float temperature = 0.8f;  // <= 0: greedy
  int top_k = 40;            // <= 0: disabled
  float top_p = 0.95f;       // 1: disabled
  float min_p = 0.05f;       // 0: disabled
  uint64_t seed = 0xD5BA4C;  // RNG seed (reproducible for a given seed)
  SamplingRule rule = kUnseededRule;

  bool greedy() const { return temperature <= 0.f; }
  /// Throws dspark::InvalidArgument naming the parameter, the allowed range
  /// and the value found: temperature must be finite and >= 0, top_p in
  /// (0, 1], min_p in [0, 1], top_k >= 0.
  void validate() const;
};

/// A sparse probability distribution over token ids, sorted by descending
/// probability (ties: ascending id). probs sum to 1.
struct Distribution {
  std::vector<TokenId> ids;
  std::vector<float> probs;

  /// Probability of `id` (0 when outside the support).
  float prob(TokenId id) const;
  size_t size() const { return ids.size(); }
};

/// Argmax of logits [V] (ties: smallest id). Throws dspark::Error naming the
/// token when a logit is NaN or +inf (corrupt or overflowing weights).
TokenId argmax(const float* logits, int64_t V);

/// The ids of the k largest logits of [V] (fp32), in candidate order
/// (descending logit, ties by ascending id): the first k of a full sort in
/// one pass over V, which is what top-k sampling pays per verified position.
/// Throws InvalidArgument unless 1 <= k <= V.
std::vector<TokenId> top_k_ids(const float* logits, int64_t V, int64_t k);

/// Applies steps 1-6 to logits [V] (fp32). Requires !params.greedy().
/// Throws dspark::Error for a NaN or +inf logit, as argmax does.
Distribution process_logits(const float* logits, int64_t V, const SamplingParams& params);

/// The RNG used for every sampling decision: a 64-bit Mersenne twister.
class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  /// Uniform double in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(gen_() >> 11) * 0x1.0p-53; }

 private:
  std::mt19937_64 gen_;
};

/// Draws one token from `dist` by inverse CDF in its stored order.
TokenId sample(const Distribution& dist, Rng& rng);

/// Draws the token of absolute position `position` (0-based, prompt
/// included) from `dist` under params.rule: Rejection → sample(dist, rng);
/// SeedStable → gumbel_argmax(dist, params.seed, position), leaving `rng`
/// untouched.
TokenId draw(const Distribution& dist, const SamplingParams& params, Rng& rng, int64_t position);

}  // namespace dspark
