// Prompt-lookup drafts; see include/dspark/speculative/lookup.hpp.
#include "dspark/speculative/lookup.hpp"

#include <algorithm>
#include <string>

#include "dspark/error.hpp"
#include "dspark/speculative/drafter_config.hpp"

namespace dspark {

void LookupOptions::validate() const {
  if (!enabled()) return;
  if (max_ngram < min_ngram)
    throw InvalidArgument("lookup: the longest n-gram (" + std::to_string(max_ngram) +
                          ") must be at least the shortest (" + std::to_string(min_ngram) + ")");
  if (max_draft < 1 || max_draft > kMaxGamma)
    throw InvalidArgument("lookup: draft length must be in [1, " + std::to_string(kMaxGamma) + "], got " +
                          std::to_string(max_draft));
}

std::vector<TokenId> lookup_draft(std::span<const TokenId> history, int min_ngram, int max_ngram, int max_tokens) {
  const auto L = static_cast<int64_t>(history.size());
  if (min_ngram < 1 || max_tokens < 1) return {};
  for (int64_t n = std::min<int64_t>(max_ngram, L - 1); n >= min_ngram; --n) {
    const auto suffix = history.subspan(static_cast<size_t>(L - n));
    // Occurrences ending at e (exclusive), most recent first; e < L keeps
    // at least one token after the match.
    for (int64_t e = L - 1; e >= n; --e) {
      if (!std::equal(suffix.begin(), suffix.end(), history.begin() + (e - n))) continue;
      std::vector<TokenId> draft;
      draft.reserve(static_cast<size_t>(max_tokens));
      for (int64_t j = 0; j < max_tokens; ++j) {
        const int64_t src = e + j;
        draft.push_back(src < L ? history[static_cast<size_t>(src)] : draft[static_cast<size_t>(src - L)]);
      }
      return draft;
    }
  }
  return {};
}

}  // namespace dspark
