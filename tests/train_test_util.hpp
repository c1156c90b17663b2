// Shared by the trainer tests: random data sets and a tiny random Llama
// target with a trainer configuration sized for it.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "dspark/model/target.hpp"
#include "dspark/train/data.hpp"
#include "dspark/train/trainer.hpp"
#include "test_util.hpp"

namespace dspark::test {

/// n sequences of `len` random tokens in [3, vocab), the first `prompt` unsupervised.
inline std::vector<train::TrainSequence> random_sequences(int n, int len, int prompt, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<train::TrainSequence> out(static_cast<size_t>(n));
  for (auto& s : out) {
    for (int t = 0; t < len; ++t) {
      s.tokens.push_back(static_cast<TokenId>(3 + rng() % static_cast<uint64_t>(vocab - 3)));
      s.loss_mask.push_back(t >= prompt ? 1 : 0);
    }
  }
  return out;
}

/// A tiny random Llama (test::write_tiny_llama) and a 4-step trainer config for it.
struct TinySetup {
  TempDir dir;
  std::unique_ptr<TargetModel> target;
  explicit TinySetup(uint64_t seed = 1234) {
    write_tiny_llama(dir.file("tiny.gguf"), seed);
    target = load_target(dir.file("tiny.gguf"));
  }
  train::TrainConfig config(const std::string& data, const std::string& out) const {
    train::TrainConfig c;
    c.data_dirs = {data};
    c.out_dir = out;
    c.drafter.gamma = 4;
    c.drafter.n_layers = 1;
    c.drafter.seq_head = SeqHead::Markov;
    c.steps = 4;
    c.batch = 6;
    c.anchors_per_seq = 3;
    c.save_every = 0;
    c.eval_every = 0;
    c.seed = 5;
    c.progress = train::Progress::None;
    return c;
  }
};

/// The stats of `n` steps of a fresh run of `c`.
inline std::vector<train::StepStats> run_steps(const train::TrainConfig& c, TargetModel& target, int n) {
  train::Trainer t(c, target);
  std::vector<train::StepStats> out;
  for (int i = 0; i < n; ++i) out.push_back(t.step());
  return out;
}

/// `before` steps of a fresh run of `c`, a checkpoint, one more step (lost:
/// the run stops there), then `after` steps of a run resumed from the
/// checkpoint: the stats of the before + after steps that count.
inline std::vector<train::StepStats> run_steps_with_resume(train::TrainConfig c, TargetModel& target, int before,
                                                           int after) {
  std::vector<train::StepStats> out;
  {
    train::Trainer t(c, target);
    for (int i = 0; i < before; ++i) out.push_back(t.step());
    t.save_checkpoint();
    t.step();
  }
  c.resume = true;
  train::Trainer t(c, target);
  EXPECT_EQ(t.steps_done(), before);
  for (int i = 0; i < after; ++i) out.push_back(t.step());
  return out;
}

/// The loss of each step.
inline std::vector<double> losses(const std::vector<train::StepStats>& steps) {
  std::vector<double> out;
  for (const auto& s : steps) out.push_back(s.loss);
  return out;
}

}  // namespace dspark::test
