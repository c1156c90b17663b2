// Plain decoding and the shared generation helpers; see generate.hpp.
#include "dspark/speculative/generate.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>

#include "dspark/error.hpp"

namespace dspark {

TokenId pick_token(const float* logits, int64_t V, const SamplingParams& p, Rng& rng, int64_t position) {
  if (p.greedy()) return argmax(logits, V);
  return draw(process_logits(logits, V, p), p, rng, position);
}

TokenLogprobs token_logprobs(const float* logits, int64_t V, TokenId id, int top) {
  if (id < 0 || id >= V)
    throw InvalidArgument("token_logprobs: id " + std::to_string(id) + " outside [0, " + std::to_string(V) + ")");
  const float mx = logits[argmax(logits, V)];  // argmax refuses NaN and +inf
  double sum = 0;
  for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(logits[v]) - mx);
  const double log_z = static_cast<double>(mx) + std::log(sum);
  auto lp = [&](TokenId v) { return static_cast<float>(static_cast<double>(logits[v]) - log_z); };
  TokenLogprobs out;
  out.id = id;
  out.logprob = lp(id);
  const auto k = static_cast<size_t>(std::clamp<int64_t>(top, 0, V));
  if (k > 0) {
    std::vector<TokenId> ids(static_cast<size_t>(V));
    for (int64_t v = 0; v < V; ++v) ids[static_cast<size_t>(v)] = static_cast<TokenId>(v);
    std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(), [&](TokenId a, TokenId b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    ids.resize(k);
    for (TokenId v : ids) out.top_logprobs.push_back(lp(v));
    out.top_ids = std::move(ids);
  }
  return out;
}

void check_prompt_fits(int64_t prompt_tokens, int64_t ctx_size, int64_t model_context) {
  if (prompt_tokens <= 0) throw InvalidArgument("the prompt is empty: at least one token is needed");
  if (prompt_tokens >= ctx_size) {
    const std::string head = "prompt too long: " + std::to_string(prompt_tokens) +
                             (prompt_tokens == 1 ? " token" : " tokens") + " and a context of " +
                             std::to_string(ctx_size) + "; the context holds the prompt and at least one generated token";
    if (model_context > 0 && prompt_tokens >= model_context)
      throw InvalidArgument(head + ", and the model's context is " + std::to_string(model_context) +
                            " tokens, so the prompt must be at most " + std::to_string(model_context - 1) +
                            " tokens");
    throw InvalidArgument(head + ", so it needs at least " + std::to_string(prompt_tokens + 1) +
                          " (or a shorter prompt)");
  }
}

}  // namespace dspark
