// Plain decoding and the shared generation helpers; see generate.hpp.
#include "dspark/spec/generate.hpp"

#include <algorithm>
#include <chrono>

#include "dspark/error.hpp"

namespace dspark {

double GenerateStats::tau() const {
  if (rounds == 0) return generated_tokens > 0 ? 1.0 : 0.0;  // plain decoding
  return static_cast<double>(accepted + rounds) / static_cast<double>(rounds);
}

std::vector<double> GenerateStats::acceptance_by_position() const {
  std::vector<double> a(reached_by_position.size(), 0.0);
  for (size_t k = 0; k < a.size(); ++k)
    a[k] = reached_by_position[k] > 0
               ? static_cast<double>(accepted_by_position[k]) / reached_by_position[k]
               : 0.0;
  return a;
}

TokenId pick_token(const float* logits, int64_t V, const SamplingParams& p, Rng& rng, int64_t position) {
  if (p.greedy()) return argmax(logits, V);
  return draw(process_logits(logits, V, p), p, rng, position);
}

void check_prompt_fits(int64_t prompt_tokens, int64_t ctx_size) {
  if (prompt_tokens <= 0) throw InvalidArgument("the prompt is empty: at least one token is needed");
  if (prompt_tokens >= ctx_size) {
    throw InvalidArgument("prompt too long: " + std::to_string(prompt_tokens) +
                          " tokens, the context holds " + std::to_string(ctx_size) +
                          " (including at least one generated token)");
  }
}

}  // namespace dspark
