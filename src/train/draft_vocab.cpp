// Draft vocabulary selection: frequency count over supervised tokens.
#include "dspark/train/draft_vocab.hpp"

#include <algorithm>
#include <numeric>

#include "dspark/error.hpp"

namespace dspark::train {

void check_draft_vocab_size(int64_t size, int64_t vocab, const std::string& flag, const std::string& zero_meaning) {
  if (size > vocab)
    throw InvalidArgument(flag + " " + std::to_string(size) + " is more than the model's vocabulary of " +
                          std::to_string(vocab) + " tokens (0: " + zero_meaning + ")");
}

DraftVocab select_draft_vocab(const TrainDataset& data, int64_t size, int64_t vocab,
                              const std::vector<TokenId>& always) {
  if (size < 1) throw InvalidArgument("draft vocabulary size must be >= 1, got " + std::to_string(size));
  if (vocab < 1) throw InvalidArgument("vocabulary size must be >= 1, got " + std::to_string(vocab));
  auto check = [&](TokenId t, const char* what) {
    if (t < 0 || t >= vocab)
      throw InvalidArgument(std::string(what) + " token id " + std::to_string(t) +
                            " outside the vocabulary [0, " + std::to_string(vocab) + ")");
  };
  std::vector<int64_t> count(static_cast<size_t>(vocab), 0);
  DraftVocab out;
  for (const auto& s : data.sequences) {
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      if (!s.loss_mask[i]) continue;
      check(s.tokens[i], "data");
      ++count[static_cast<size_t>(s.tokens[i])];
      ++out.supervised;
    }
  }
  std::vector<char> chosen(static_cast<size_t>(vocab), 0);
  int64_t n_chosen = 0;
  for (TokenId t : always) {
    check(t, "required");
    if (!chosen[static_cast<size_t>(t)]) chosen[static_cast<size_t>(t)] = 1, ++n_chosen;
  }
  std::vector<TokenId> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](TokenId a, TokenId b) { return count[static_cast<size_t>(a)] > count[static_cast<size_t>(b)]; });
  const int64_t want = std::min(vocab, std::max<int64_t>(size, n_chosen));
  for (TokenId t : order) {
    if (n_chosen >= want) break;
    if (!chosen[static_cast<size_t>(t)]) chosen[static_cast<size_t>(t)] = 1, ++n_chosen;
  }
  for (int64_t t = 0; t < vocab; ++t) {
    if (count[static_cast<size_t>(t)] > 0) ++out.distinct;
    if (!chosen[static_cast<size_t>(t)]) continue;
    out.ids.push_back(static_cast<TokenId>(t));
    out.covered += count[static_cast<size_t>(t)];
  }
  return out;
}

}  // namespace dspark::train
