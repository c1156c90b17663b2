// dspark/train/draft_vocab.hpp — choosing a drafter's draft vocabulary
// (DrafterConfig::draft_vocab) from its training data.
//
// The draft vocabulary is the set of tokens the drafter may propose. Picking
// the most frequent response tokens of the self-distilled data keeps nearly
// all of the drafter's acceptance while each drafting pass evaluates far
// fewer LM-head rows (the FR-Spec / EAGLE-3 reduced draft vocabulary).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dspark/model/target.hpp"
#include "dspark/train/data.hpp"

namespace dspark::train {

struct DraftVocab {
  std::vector<TokenId> ids;     // ascending token ids
  int64_t supervised = 0;       // supervised tokens counted
  int64_t covered = 0;          // ... of which are in `ids`
  int64_t distinct = 0;         // distinct supervised token ids in the data

  /// Share of supervised tokens inside the draft vocabulary (0 when none).
  double coverage() const { return supervised ? static_cast<double>(covered) / static_cast<double>(supervised) : 0; }
};

/// The `size` most frequent supervised (loss_mask = 1) tokens of `data`
/// (ties: smaller id first), together with every id of `always` (e.g. the
/// target's end-of-turn ids, which end most responses), sorted ascending.
/// When the data holds fewer distinct tokens, the vocabulary is filled up
/// with the smallest remaining ids below `vocab`, so its size is exactly
/// max(size, |always|) (capped at `vocab`).
/// Throws InvalidArgument when size < 1, vocab < 1, or an id of `always` or
/// of the data lies outside [0, vocab).
/// Refuses a draft vocabulary of `size` tokens past the model's `vocab`,
/// naming the option `flag` and what its 0 means (`zero_meaning`):
/// InvalidArgument "FLAG N is more than the model's vocabulary of V tokens
/// (0: ZERO_MEANING)".
void check_draft_vocab_size(int64_t size, int64_t vocab, const std::string& flag, const std::string& zero_meaning);

DraftVocab select_draft_vocab(const TrainDataset& data, int64_t size, int64_t vocab,
                              const std::vector<TokenId>& always);

}  // namespace dspark::train
