// dspark/eval/perplexity.hpp — perplexity of a target on a text, with
// llama.cpp's `llama-perplexity` semantics (tools/perplexity), so the two
// engines' figures compare directly.
//
// The token sequence is cut into chunks of n_ctx tokens (a trailing partial
// chunk is dropped). Each chunk is evaluated from an empty cache, its first
// token replaced by BOS when the model adds one; the second half of each
// chunk is scored: positions first = n_ctx / 2 .. n_ctx - 2 each predict the
// next token, so a chunk scores n_ctx - 1 - first tokens. PPL = exp(mean NLL)
// over all scored tokens, and its error estimate is ppl · sqrt(var(NLL) /
// (count - 1)) as llama.cpp prints it.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "dspark/model/target.hpp"

namespace dspark::eval {

struct PerplexityOptions {
  int64_t n_ctx = 512;   // tokens per chunk (>= 4)
  int64_t max_chunks = -1;  // < 0: every whole chunk
  TokenId bos = -1;      // >= 0: the first token of every chunk becomes BOS
};

struct PerplexityResult {
  int64_t chunks = 0;
  int64_t scored = 0;           // tokens scored
  double nll = 0;               // mean negative log-likelihood (nats)
  double ppl = 0;               // exp(nll)
  double ppl_error = 0;         // llama.cpp's "+/-" estimate
  std::vector<double> running;  // PPL after each chunk
};

/// The number of chunks perplexity() scores for n_tokens tokens; throws
/// InvalidArgument as perplexity() does (n_ctx < 4, above the model's
/// context, or fewer than n_ctx tokens).
int64_t perplexity_chunks(const TargetModel& target, int64_t n_tokens, const PerplexityOptions& opts);

/// Scores `tokens` as described above. `on_chunk(i, running_ppl)` is called
/// after chunk i (0-based). Throws InvalidArgument when n_ctx < 4, exceeds the
/// model's context, or the text holds fewer than n_ctx tokens.
PerplexityResult perplexity(TargetModel& target, std::span<const TokenId> tokens, const PerplexityOptions& opts,
                            const std::function<void(int64_t, double)>& on_chunk = {});

}  // namespace dspark::eval
