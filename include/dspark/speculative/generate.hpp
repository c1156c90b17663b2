// dspark/speculative/generate.hpp — the generation result shared by plain and
// speculative decoding, and plain (one token per target call) decoding.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "dspark/model/target.hpp"
#include "dspark/speculative/sampling.hpp"
#include "dspark/speculative/stats.hpp"

namespace dspark {

/// Called for every emitted token, in order. Return false to stop generation
/// (the token is still counted as emitted).
using TokenCallback = std::function<bool(TokenId)>;

struct GenerateOptions {
  int64_t n_predict = 256;         // maximum tokens to emit (end-of-generation excluded)
  int64_t ctx_size = 0;            // KV capacity in tokens; 0 = the model's context length
  SamplingParams sampling;         // temperature <= 0: greedy
  std::vector<TokenId> stop_ids;   // end-of-generation ids (EOS, EOT); never emitted
  TokenCallback on_token;          // optional streaming callback
  /// -1: no log-probabilities; 0..kMaxTopLogprobs: GenerateResult::logprobs
  /// holds each emitted token's log-probability and this many alternatives.
  int top_logprobs = -1;
};

/// The target's distribution at one emitted token: log-softmax of the
/// target's logits at that position (before temperature, top-k/p and min-p),
/// so the same whether the token came from plain decoding or from a verified
/// draft, and whatever the sampling parameters.
struct TokenLogprobs {
  TokenId id = -1;
  float logprob = 0;               // log p(id), natural log, <= 0
  std::vector<TokenId> top_ids;    // the most likely tokens, descending (ties: smaller id)
  std::vector<float> top_logprobs; // their log-probabilities
};

/// TokenLogprobs of `id` from logits [V], with the `top` most likely tokens.
/// Arithmetic as in sampling.hpp (fp32 logits, the normalizer in double).
/// Throws dspark::Error for a NaN or +inf logit.
TokenLogprobs token_logprobs(const float* logits, int64_t V, TokenId id, int top);

struct GenerateResult {
  std::vector<TokenId> tokens;  // emitted tokens (no end-of-generation id)
  bool stopped_by_eog = false;  // an end-of-generation id ended it
  TokenId stop_token = -1;      // that id (-1: none)
  GenerateStats stats;
  /// One per emitted token when GenerateOptions::top_logprobs >= 0.
  std::vector<TokenLogprobs> logprobs;
};

/// Plain autoregressive decoding: prefill the prompt, then one target call per
/// token. Throws dspark::InvalidArgument when the prompt is empty or does not
/// fit the context (the message gives both lengths), or for invalid sampling
/// parameters. Generation also ends when the context is full.
GenerateResult generate_plain(TargetModel& model, const std::vector<TokenId>& prompt,
                              const GenerateOptions& opts);

/// Picks the token of absolute position `position` from logits [V]: argmax
/// when greedy, else draw() from the processed distribution.
TokenId pick_token(const float* logits, int64_t V, const SamplingParams& p, Rng& rng, int64_t position);

/// Validates prompt length against the context of `ctx_size` tokens (the
/// prompt and at least one generated token); throws InvalidArgument. A
/// prompt that no context size could hold (at least `model_context`, the
/// model's trained context; 0: unknown) is told the longest prompt allowed.
void check_prompt_fits(int64_t prompt_tokens, int64_t ctx_size, int64_t model_context);

}  // namespace dspark
