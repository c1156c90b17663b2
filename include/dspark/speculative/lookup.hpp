// dspark/speculative/lookup.hpp — prompt-lookup (n-gram) drafts: a draft copied
// from the sequence's own history, needing no drafter model.
//
// The history is the prompt followed by every emitted token; its last token
// is the anchor. For n from max_ngram down to min_ngram, the last n tokens
// are searched for in the history (most recent earlier occurrence first);
// the first match proposes the tokens that followed it. A continuation that
// reaches the end of the history goes on with its own proposals, so a
// sequence caught in a loop of period P gets the whole loop repeated (the
// extended sequence h ++ d satisfies d_j = (h ++ d)_{e+j}, e the match end).
//
// Lookup drafts are deterministic: under sampling their draw distribution is
// one-hot, so verification accepts x with probability p(x) and a rejection
// resamples from p with x removed (speculative.hpp) — lossless as for any
// draft. Greedy and seed-stable outputs equal plain decoding token for token.
#pragma once

#include <span>
#include <vector>

#include "dspark/speculative/sampling.hpp"

namespace dspark {

struct LookupOptions {
  int min_ngram = 0;   // shortest suffix matched; 0: lookup drafts off
  int max_ngram = 4;   // longest suffix tried first
  int max_draft = 16;  // most tokens one lookup draft proposes (llama.cpp's --draft-max default)

  bool enabled() const { return min_ngram > 0; }
  /// Throws InvalidArgument naming the option when enabled and
  /// min_ngram > max_ngram, or max_draft is outside [1, kMaxGamma].
  void validate() const;
};

/// Up to `max_tokens` draft tokens continuing `history` (see the header
/// comment); empty when no suffix of min_ngram..max_ngram tokens occurred
/// earlier, or when the history is shorter than min_ngram + 1.
std::vector<TokenId> lookup_draft(std::span<const TokenId> history, int min_ngram, int max_ngram, int max_tokens);

}  // namespace dspark
