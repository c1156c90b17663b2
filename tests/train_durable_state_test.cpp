// Tests for what a run needs to continue on another machine:
//  - a data set's fingerprint (include/dspark/train/data_fingerprint.hpp) tells the same
//    sequences in the same order from any other data;
//  - a checkpoint copied elsewhere, with its data copied elsewhere too (the
//    originals gone), resumes bit for bit: nothing in it depends on the paths
//    of the machine that wrote it;
//  - a resume on other data is refused, naming both data sets.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "dspark/error.hpp"
#include "dspark/train/data.hpp"
#include "dspark/train/data_fingerprint.hpp"
#include "dspark/train/trainer.hpp"
#include "test_util.hpp"
#include "train_test_util.hpp"

namespace {

using namespace dspark;
using namespace dspark::train;
using test::random_sequences;
using test::TinySetup;
namespace fs = std::filesystem;

TEST(TrainDurableState, FingerprintTellsSequencesAndTheirOrder) {
  test::TempDir dir;
  const auto seqs = random_sequences(4, 12, 3, 50, 7);
  write_dataset(dir.file("a"), "t", seqs, /*per_shard=*/4, {{"sampling", {{"seed", 0}}}});
  write_dataset(dir.file("a2"), "t", seqs, /*per_shard=*/2);  // other shards, same sequences
  auto swapped = seqs;
  std::swap(swapped[1], swapped[2]);
  write_dataset(dir.file("b"), "t", swapped);
  auto masked = seqs;
  masked[0].loss_mask[5] ^= 1;
  write_dataset(dir.file("c"), "t", masked);
  auto split = seqs;  // the same tokens, cut into other sequences
  split[1].tokens.insert(split[1].tokens.begin(), split[0].tokens.back());
  split[1].loss_mask.insert(split[1].loss_mask.begin(), split[0].loss_mask.back());
  split[0].tokens.pop_back();
  split[0].loss_mask.pop_back();
  write_dataset(dir.file("d"), "t", split);

  const nlohmann::json a = data_fingerprint(TrainDataset::load(dir.file("a")));
  EXPECT_EQ(a.at("n_sequences"), 4);
  EXPECT_EQ(a.at("n_tokens"), 48);
  EXPECT_EQ(a.at("n_supervised"), 36);
  EXPECT_EQ(a.at("hash").get<std::string>().size(), 16u);
  EXPECT_EQ(a.at("recipe").at("target_id"), "t");
  EXPECT_EQ(a.at("recipe").at("sampling").at("seed"), 0);
  EXPECT_EQ(data_fingerprint(TrainDataset::load(dir.file("a2"))).at("hash"), a.at("hash"));
  for (const char* other : {"b", "c", "d"}) {
    const nlohmann::json f = data_fingerprint(TrainDataset::load(dir.file(other)));
    EXPECT_EQ(f.at("n_tokens"), 48) << other;
    EXPECT_NE(f.at("hash"), a.at("hash")) << other;
  }
}

TEST(TrainDurableState, ACheckpointCopiedElsewhereResumesBitForBit) {
  TinySetup s;
  const std::string data = s.dir.file("data");
  const auto seqs = random_sequences(5, 30, 6, s.target->info().vocab, 3);
  write_dataset(data, s.target->info().id, seqs);

  // Uninterrupted: 4 steps.
  TrainConfig ca = s.config(data, s.dir.file("a"));
  Trainer ta(ca, *s.target);
  std::vector<double> loss_a;
  for (int i = 0; i < 4; ++i) loss_a.push_back(ta.step().loss);

  // 2 steps and a checkpoint on the first machine ...
  std::vector<double> loss_b;
  {
    Trainer tb(s.config(data, s.dir.file("b")), *s.target);
    for (int i = 0; i < 2; ++i) loss_b.push_back(tb.step().loss);
    tb.save_checkpoint();
  }
  // ... the run and its data copied to another machine's paths, the
  // originals gone.
  fs::create_directories(s.dir.file("new"));
  fs::copy(s.dir.file("b"), s.dir.file("new/run"), fs::copy_options::recursive);
  fs::copy(data, s.dir.file("new/data"), fs::copy_options::recursive);
  fs::remove_all(s.dir.file("b"));
  fs::remove_all(data);

  TrainConfig cm = s.config(s.dir.file("new/data"), s.dir.file("new/run"));
  cm.resume = true;
  {
    Trainer tm(cm, *s.target);
    EXPECT_EQ(tm.steps_done(), 2);
    for (int i = 0; i < 2; ++i) loss_b.push_back(tm.step().loss);
    EXPECT_EQ(loss_a, loss_b);
    for (const auto& [name, p] : ta.drafter().params())
      EXPECT_TRUE(at::equal(p, tm.drafter().params().at(name))) << name;
  }

  // The checkpoint names its data: the fingerprint of what it trained on.
  const fs::path state = s.dir.file("new/run/checkpoints/step-00000002/trainer_state.json");
  ASSERT_TRUE(fs::exists(state));
  nlohmann::json st;
  std::ifstream(state) >> st;
  EXPECT_EQ(st.at("data"), data_fingerprint(TrainDataset::load(s.dir.file("new/data"))));

  // Other data (the same size, other tokens) is refused, saying so.
  const std::string other = s.dir.file("other");
  write_dataset(other, s.target->info().id, random_sequences(5, 30, 6, s.target->info().vocab, 4));
  TrainConfig co = cm;
  co.data_dirs = {other};
  const std::string msg = test::message_of<InvalidArgument>([&] { Trainer t(co, *s.target); });
  EXPECT_MENTIONS(msg, "trained on other data (5 sequences, 150 tokens, hash " + st.at("data").at("hash").get<std::string>());
  EXPECT_MENTIONS(msg, other);
}

}  // namespace
