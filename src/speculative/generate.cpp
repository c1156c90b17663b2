// Plain decoding and the shared generation helpers; see generate.hpp.
#include "dspark/speculative/generate.hpp"

#include <algorithm>
#include <chrono>

#include "dspark/error.hpp"

namespace dspark {

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
