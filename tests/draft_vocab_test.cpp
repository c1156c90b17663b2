// Draft vocabulary selection (select_draft_vocab) on hand-counted data.
#include <gtest/gtest.h>

#include "dspark/error.hpp"
#include "dspark/train/draft_vocab.hpp"

namespace {

using namespace dspark;
using namespace dspark::train;

TrainDataset data_of(std::vector<std::pair<std::vector<TokenId>, std::vector<uint8_t>>> seqs) {
  TrainDataset d;
  d.target_id = std::string("target");
  for (auto& [t, m] : seqs) {
    TrainSequence s;
    s.tokens = t;
    s.loss_mask = m;
    d.sequences.push_back(s);
  }
  return d;
}

TEST(DraftVocab, MostFrequentSupervisedTokensPlusRequiredIds) {
  // Supervised counts: 5 -> 3, 7 -> 2, 9 -> 2, 4 -> 1. Token 1 appears only
  // in prompts (mask 0) and is not counted.
  const TrainDataset d = data_of({{{1, 1, 1, 5, 7, 5}, {0, 0, 0, 1, 1, 1}},
                                  {{1, 9, 9, 4, 5, 7}, {0, 1, 1, 1, 1, 1}}});
  DraftVocab v = select_draft_vocab(d, 2, 16, {});
  // 5 first, then the tie 7/9 goes to the smaller id.
  EXPECT_EQ(v.ids, (std::vector<TokenId>{5, 7}));
  EXPECT_EQ(v.supervised, 8);
  EXPECT_EQ(v.covered, 5);
  EXPECT_EQ(v.distinct, 4);
  EXPECT_DOUBLE_EQ(v.coverage(), 5.0 / 8.0);

  // Required ids count towards the size and come out sorted.
  v = select_draft_vocab(d, 3, 16, {15});
  EXPECT_EQ(v.ids, (std::vector<TokenId>{5, 7, 15}));
  EXPECT_EQ(v.covered, 5);

  // More than the data's distinct tokens: filled with the smallest unused ids.
  v = select_draft_vocab(d, 6, 16, {});
  EXPECT_EQ(v.ids, (std::vector<TokenId>{0, 1, 4, 5, 7, 9}));
  EXPECT_EQ(v.covered, 8);

  // Capped at the vocabulary.
  v = select_draft_vocab(d, 100, 16, {});
  EXPECT_EQ(v.ids.size(), 16u);
}

TEST(DraftVocab, RefusesBadArguments) {
  const TrainDataset d = data_of({{{1, 20}, {0, 1}}});
  EXPECT_THROW(select_draft_vocab(d, 0, 32, {}), InvalidArgument);
  EXPECT_THROW(select_draft_vocab(d, 4, 16, {}), InvalidArgument);   // data id 20 >= 16
  EXPECT_THROW(select_draft_vocab(d, 4, 32, {40}), InvalidArgument);  // required id outside
}

}  // namespace
