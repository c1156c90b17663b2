// Tests for the training data set format, the trainer (learning-rate
// schedule, checkpoints, bit-exact resume, training on a draft vocabulary)
// and an end-to-end overfit proof:
// a drafter trained on three sequences of the target's own greedy
// continuations reaches τ >= 3 in real speculative decoding on them.
// The overfit test runs on a tiny random Llama by default; with
// DSPARK_TEST_FULL=1 it also runs on SmolLM2-135M-Instruct.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "dspark/error.hpp"
#include "dspark/io/safetensors.hpp"
#include "dspark/model/loaded_model.hpp"
#include "dspark/model/target.hpp"
#include "dspark/speculative/checkpoint.hpp"
#include "dspark/speculative/generate.hpp"
#include "dspark/speculative/speculative.hpp"
#include "dspark/train/data.hpp"
#include "dspark/train/data_fingerprint.hpp"
#include "dspark/train/draft_vocab.hpp"
#include "dspark/train/feature_cache.hpp"
#include "dspark/train/regen.hpp"
#include "dspark/train/trainer.hpp"
#include "test_util.hpp"
#include "train_test_util.hpp"

namespace {

using namespace dspark;
using namespace dspark::train;
using test::random_sequences;
using test::TinySetup;
namespace fs = std::filesystem;

bool full_mode() {
  const char* v = std::getenv("DSPARK_TEST_FULL");
  return v != nullptr && *v != '\0' && std::string(v) != "0";
}

// ---- data set ----------------------------------------------------------------

TEST(TrainData, RoundTripAndRegenReaderAgree) {
  test::TempDir dir;
  auto seqs = random_sequences(5, 12, 4, 100, 1);
  seqs[2].id = "custom-id";
  seqs[3].tokens.clear();
  seqs[3].loss_mask.clear();
  write_dataset(dir.path().string(), "llama/x", seqs, /*per_shard=*/2, {{"note", "t"}});
  EXPECT_TRUE(fs::exists(dir.file("data-00000.safetensors")));
  EXPECT_TRUE(fs::exists(dir.file("data-00002.safetensors")));
  TrainDataset ds = TrainDataset::load(dir.path().string());
  EXPECT_EQ(ds.target_id, "llama/x");
  EXPECT_EQ(ds.manifest["note"], "t");
  ASSERT_EQ(ds.sequences.size(), seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    EXPECT_EQ(ds.sequences[i].tokens, seqs[i].tokens);
    EXPECT_EQ(ds.sequences[i].loss_mask, seqs[i].loss_mask);
  }
  EXPECT_EQ(ds.sequences[2].id, "custom-id");
  EXPECT_EQ(ds.sequences[0].id, "seq-0");
  EXPECT_EQ(ds.supervised_tokens(), 4 * 8);
  // The regeneration command's reader accepts the same directory.
  auto rs = read_regen_dir(dir.path().string());
  ASSERT_EQ(rs.size(), seqs.size());
  EXPECT_EQ(rs[4].tokens, seqs[4].tokens);
  EXPECT_EQ(rs[4].loss_mask, seqs[4].loss_mask);
}

TEST(TrainData, SeveralDirectoriesLoadAsOneInOrder) {
  test::TempDir dir;
  const auto a = random_sequences(3, 10, 3, 100, 5), b = random_sequences(2, 8, 2, 100, 6);
  write_dataset(dir.file("a"), "llama/x", a, /*per_shard=*/2);
  write_dataset(dir.file("b"), "llama/x", b);
  const TrainDataset ds = TrainDataset::load(std::vector<std::string>{dir.file("a"), dir.file("b")});
  EXPECT_EQ(ds.target_id, "llama/x");
  ASSERT_EQ(ds.sequences.size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(ds.sequences[i].tokens, (i < 3 ? a[i] : b[i - 3]).tokens) << i;
  EXPECT_EQ(ds.supervised_tokens(), 3 * 7 + 2 * 6);
  ASSERT_EQ(ds.manifest["parts"].size(), 2u);
  EXPECT_EQ(ds.manifest["parts"][1]["n_sequences"], 2);
  // One directory is load(dir) itself: same manifest, so fingerprints of
  // runs on one data set do not change.
  EXPECT_EQ(TrainDataset::load(std::vector<std::string>{dir.file("a")}).manifest,
            TrainDataset::load(dir.file("a")).manifest);
  // The fingerprint tells the order apart.
  EXPECT_NE(data_fingerprint(ds).at("hash"),
            data_fingerprint(TrainDataset::load(std::vector<std::string>{dir.file("b"), dir.file("a")})).at("hash"));
  EXPECT_TRUE(data_fingerprint(ds).at("recipe").is_array());

  write_dataset(dir.file("c"), "llama/other", b);
  EXPECT_THROW(TrainDataset::load(std::vector<std::string>{dir.file("a"), dir.file("c")}), InvalidArgument);
  EXPECT_THROW(TrainDataset::load(std::vector<std::string>{dir.file("a"), dir.file("a")}), InvalidArgument);
  EXPECT_THROW(TrainDataset::load(std::vector<std::string>{}), InvalidArgument);
}

TEST(TrainData, RejectsMalformedShards) {
  test::TempDir dir;
  auto seqs = random_sequences(2, 6, 2, 50, 2);
  write_dataset(dir.path().string(), "t", seqs);
  const std::string shard = dir.file("data-00000.safetensors");
  auto rewrite = [&](at::Tensor tok, at::Tensor off, at::Tensor msk) {
    io::save_safetensors(shard, {{"tokens", tok}, {"offsets", off}, {"loss_mask", msk}});
  };
  at::Tensor tok = at::zeros({12}, at::kInt), msk = at::ones({12}, at::kByte);
  rewrite(tok, at::tensor({0, 6, 11}, at::kLong), msk);  // does not end at N_tok
  EXPECT_THROW(TrainDataset::load(dir.path().string()), FormatError);
  rewrite(tok, at::tensor({0, 13, 12}, at::kLong), msk);  // decreasing, beyond N_tok
  EXPECT_THROW(TrainDataset::load(dir.path().string()), FormatError);
  rewrite(tok, at::tensor({0, 6, 12}, at::kLong), at::ones({11}, at::kByte));  // mask length
  EXPECT_THROW(TrainDataset::load(dir.path().string()), FormatError);
  rewrite(tok.to(at::kFloat), at::tensor({0, 6, 12}, at::kLong), msk);  // dtype
  EXPECT_THROW(TrainDataset::load(dir.path().string()), FormatError);
  rewrite(tok, at::tensor({0, 6, 12}, at::kLong), msk);
  EXPECT_NO_THROW(TrainDataset::load(dir.path().string()));
  test::write_bytes(dir.file("manifest.json"), R"({"target_id": "t", "shards": ["../x.safetensors"]})");
  EXPECT_THROW(TrainDataset::load(dir.path().string()), FormatError);
  test::write_bytes(dir.file("manifest.json"), R"({"target_id": "t", "n_sequences": 3, "shards": ["data-00000.safetensors"]})");
  EXPECT_THROW(TrainDataset::load(dir.path().string()), FormatError);
  test::write_bytes(dir.file("manifest.json"), R"({"shards": []})");
  EXPECT_THROW(TrainDataset::load(dir.path().string()), FormatError);
  EXPECT_THROW(TrainDataset::load(dir.file("missing")), Error);
}

// ---- trainer -----------------------------------------------------------------------

TEST(TrainTrainer, LearningRateWarmupThenCosine) {
  TrainConfig c;
  c.steps = 100;
  c.lr = 1e-3;
  c.warmup = 0.04;
  EXPECT_NEAR(lr_at(c, 0), 0.25e-3, 1e-12);
  EXPECT_NEAR(lr_at(c, 3), 1e-3, 1e-12);
  EXPECT_NEAR(lr_at(c, 4), 1e-3, 1e-12);
  EXPECT_NEAR(lr_at(c, 52), 0.5e-3, 1e-12);
  EXPECT_GT(lr_at(c, 99), 0.0);
  EXPECT_LT(lr_at(c, 99), 1e-5);
  for (int64_t s = 4; s < 99; ++s) EXPECT_GE(lr_at(c, s), lr_at(c, s + 1));
  c.warmup = 0;
  EXPECT_NEAR(lr_at(c, 0), 1e-3, 1e-12);
}

TEST(TrainTrainer, ResumeContinuesBitForBit) {
  TinySetup s;
  const std::string data = s.dir.file("data");
  write_dataset(data, s.target->info().id, random_sequences(5, 30, 6, s.target->info().vocab, 3));

  // Run a keeps target features in memory (4 steps of 2 sequences revisit
  // some of the 5), runs b/c recompute them: bf16 features must give the
  // same steps either way.
  TrainConfig ca = s.config(data, s.dir.file("a"));
  ca.feature_cache_mb = 16;
  Trainer ta(ca, *s.target);
  std::vector<double> loss_a;
  for (int i = 0; i < 4; ++i) loss_a.push_back(ta.step().loss);

  TrainConfig cb = s.config(data, s.dir.file("b"));
  std::vector<double> loss_b;
  {
    Trainer tb(cb, *s.target);
    for (int i = 0; i < 2; ++i) loss_b.push_back(tb.step().loss);
    tb.save_checkpoint();
    tb.step();  // progress after the checkpoint is discarded by the resume
  }
  cb.resume = true;
  Trainer tc(cb, *s.target);
  EXPECT_EQ(tc.steps_done(), 2);
  for (int i = 0; i < 2; ++i) loss_b.push_back(tc.step().loss);
  EXPECT_EQ(loss_a, loss_b);
  for (const auto& [name, p] : ta.drafter().params())
    EXPECT_TRUE(at::equal(p, tc.drafter().params().at(name))) << name;
  // And training moved the parameters at all.
  Drafter fresh = Drafter::init(ta.drafter().config(), ca.seed);
  EXPECT_FALSE(at::equal(fresh.params().at("fc.weight"), ta.drafter().params().at("fc.weight")));

  // A resume with another seed is refused.
  TrainConfig cd = cb;
  cd.seed = 6;
  EXPECT_THROW(Trainer(cd, *s.target), InvalidArgument);
  // Nothing to resume from.
  TrainConfig ce = s.config(data, s.dir.file("none"));
  ce.resume = true;
  EXPECT_THROW(Trainer(ce, *s.target), Error);
}

TEST(TrainTrainer, DiskFeatureCacheGivesTheSameSteps) {
  TinySetup s;
  const std::string data = s.dir.file("data");
  write_dataset(data, s.target->info().id, random_sequences(5, 30, 6, s.target->info().vocab, 3));
  const std::string cache = s.dir.file("cache");
  auto run = [&](const std::string& out, const std::string& cache_dir, int64_t* target_tokens) {
    TrainConfig c = s.config(data, s.dir.file(out));
    c.feature_cache_dir = cache_dir;
    Trainer t(c, *s.target);
    std::vector<double> losses;
    for (int i = 0; i < 4; ++i) {
      const StepStats st = t.step();
      losses.push_back(st.loss);
      if (target_tokens) *target_tokens += st.tokens;
    }
    return losses;
  };
  int64_t first = 0, again = 0;
  const auto plain = run("a", "", nullptr);
  // 4 steps of 2 sequences visit all 5 (and revisit some, read back from disk).
  EXPECT_EQ(run("b", cache, &first), plain);
  EXPECT_GT(first, 0);
  int files = 0;
  for (const auto& e : fs::directory_iterator(cache)) files += e.path().extension() == ".bin";
  EXPECT_EQ(files, 5);
  EXPECT_TRUE(fs::exists(fs::path(cache) / "cache.json"));
  // A second run reads every sequence from disk: the target never runs.
  EXPECT_EQ(run("c", cache, &again), plain);
  EXPECT_EQ(again, 0);
  // A truncated entry is recomputed, with the same result.
  const fs::path victim = fs::path(cache) / "seq-00000002.bin";
  fs::resize_file(victim, fs::file_size(victim) / 2);
  int64_t after = 0;
  EXPECT_EQ(run("d", cache, &after), plain);
  EXPECT_GT(after, 0);
  // Another precision needs other features: refused, with both keys named.
  TrainConfig c = s.config(data, s.dir.file("e"));
  c.feature_cache_dir = cache;
  c.precision = MatmulPrecision::Float32;
  try {
    Trainer t(c, *s.target);
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("this feature cache holds features for"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("\"dtype\":\"f32\""), std::string::npos) << e.what();
  }
}

TEST(TrainFeatureCache, EntriesBelongToTheirTokens) {
  test::TempDir dir;
  const FeatureCacheKey key{"llama/x", {1, 3}, 64, true, true};
  DiskFeatureCache cache(dir.file("c"), key);
  EXPECT_EQ(feature_bytes_per_token(key, 8), 3 * 8 * 2 + 12);
  TargetFeatures f{at::randn({4, 16}).to(at::kBFloat16), at::randn({4, 8}).to(at::kBFloat16), at::randn({4}),
                   at::arange(4, at::kLong)};
  const std::vector<TokenId> toks = {5, 6, 7, 8}, other = {5, 6, 7, 9};
  EXPECT_FALSE(cache.get(0, toks));
  cache.put(0, toks, f);
  EXPECT_EQ(cache.writes(), 1);
  const auto back = cache.get(0, toks);
  ASSERT_TRUE(back);
  EXPECT_TRUE(at::equal(back->taps, f.taps));
  EXPECT_TRUE(at::equal(back->final_hidden, f.final_hidden));
  EXPECT_TRUE(at::equal(back->lse, f.lse));
  EXPECT_TRUE(at::equal(back->argmax, f.argmax));
  // Another sequence content at the same index (the data set changed): not used.
  EXPECT_FALSE(cache.get(0, other));
  EXPECT_FALSE(cache.get(1, toks));
  EXPECT_EQ(cache.hits(), 1);
  // The same directory with the same key opens; with another key it is refused.
  EXPECT_NO_THROW(DiskFeatureCache(dir.file("c"), key));
  FeatureCacheKey k2 = key;
  k2.tap_layers = {1, 2};
  EXPECT_THROW(DiskFeatureCache(dir.file("c"), k2), InvalidArgument);
}

TEST(TrainTrainer, SplitSeedFixesTheHeldOutSetAcrossSeeds) {
  // The held-out split follows split_seed (default: seed), so runs that
  // continue one another with other seeds keep one held-out set.
  TinySetup s;
  const std::string data = s.dir.file("data");
  write_dataset(data, s.target->info().id, random_sequences(200, 24, 5, s.target->info().vocab, 4));
  auto eval_of = [&](uint64_t seed, std::optional<uint64_t> split) {
    TrainConfig c = s.config(data, s.dir.file("out"));
    c.seed = seed;
    c.split_seed = split;
    return Trainer(c, *s.target).eval_indices();
  };
  const auto a = eval_of(1, std::nullopt), b = eval_of(2, std::nullopt);
  ASSERT_EQ(a.size(), 4u);  // 2% of 200
  EXPECT_NE(a, b);
  EXPECT_EQ(eval_of(2, 1), a);
  EXPECT_EQ(eval_of(7, 1), a);
  EXPECT_EQ(eval_of(1, 1), a);
  EXPECT_EQ(eval_of(1, 2), b);
}

// --eval-only: every sequence of a data set is held out, and its figures
// equal those of the same sequence held out of a training run (all anchors
// taken, so the anchor draw does not matter).
TEST(TrainTrainer, EvalOnlyHoldsOutEverySequenceAndMatchesTheSplit) {
  TinySetup s;
  const auto seqs = random_sequences(60, 24, 5, s.target->info().vocab, 4);
  const std::string data = s.dir.file("data");
  write_dataset(data, s.target->info().id, seqs);
  {
    TrainConfig c0 = s.config(data, "");
    DrafterConfig dc = c0.drafter;
    dc.complete_from(s.target->info());
    save_drafter(Drafter::init(dc, 3), s.dir.file("init"), /*bf16=*/false);
  }
  TrainConfig c = s.config(data, s.dir.file("out"));
  c.init_drafter = s.dir.file("init");
  c.eval_anchors_per_seq = 64;  // more than any sequence has: every anchor
  Trainer split(c, *s.target);
  ASSERT_EQ(split.eval_indices().size(), 1u);
  const size_t held = split.eval_indices()[0];
  const EvalStats want = split.evaluate();

  const std::string one = s.dir.file("one");
  write_dataset(one, s.target->info().id, {seqs[held]});
  TrainConfig e = c;
  e.data_dirs = {one};
  e.out_dir = "";
  e.eval_only = true;
  e.eval_max_sequences = 0;
  Trainer only(e, *s.target);
  EXPECT_EQ(only.eval_indices(), std::vector<size_t>{0});
  EXPECT_TRUE(only.train_indices().empty());
  const EvalStats got = only.evaluate();
  EXPECT_TRUE(got.held_out);
  EXPECT_EQ(got.acceptance.anchors, want.acceptance.anchors);
  EXPECT_EQ(got.acceptance.anchors, 24 - 5 - 1);  // supervised positions 5..23 with a next supervised token
  EXPECT_DOUBLE_EQ(got.acceptance.mean_tau_greedy(), want.acceptance.mean_tau_greedy());
  EXPECT_DOUBLE_EQ(got.loss, want.loss);
  EXPECT_THROW(only.step(), InvalidArgument);
  EXPECT_THROW(only.run(), InvalidArgument);
  EXPECT_FALSE(fs::exists(s.dir.file("out")));

  // Every sequence of the full set, or the first N with eval_max_sequences.
  e.data_dirs = {data};
  EXPECT_EQ(Trainer(e, *s.target).eval_indices().size(), 60u);
  e.eval_max_sequences = 7;
  EXPECT_EQ(Trainer(e, *s.target).eval_indices().size(), 7u);
  e.init_drafter.clear();
  EXPECT_THROW(Trainer(e, *s.target), InvalidArgument);  // nothing to evaluate
}

TEST(TrainTrainer, RunWritesCheckpointsExportAndMetrics) {
  TinySetup s;
  const std::string data = s.dir.file("data");
  write_dataset(data, s.target->info().id, random_sequences(60, 24, 5, s.target->info().vocab, 4));
  TrainConfig c = s.config(data, s.dir.file("out"));
  c.steps = 5;
  c.save_every = 2;
  c.eval_every = 2;
  c.keep_checkpoints = 2;
  Trainer t(c, *s.target);
  EXPECT_EQ(t.eval_indices().size(), 1u);  // 2% of 60
  EvalStats ev = t.run();
  EXPECT_TRUE(ev.held_out);
  EXPECT_GT(ev.acceptance.anchors, 0);
  EXPECT_GE(ev.acceptance.mean_tau_greedy(), 1.0);
  EXPECT_TRUE(std::isfinite(ev.loss));
  const fs::path out = s.dir.file("out");
  EXPECT_FALSE(fs::exists(out / "checkpoints" / "step-00000002"));  // pruned: keep 2
  EXPECT_TRUE(fs::exists(out / "checkpoints" / "step-00000004"));
  EXPECT_TRUE(fs::exists(out / "checkpoints" / "step-00000005" / "optimizer.pt"));
  auto latest = nlohmann::json::parse(test::read_bytes((out / "checkpoints" / "latest.json").string()));
  EXPECT_EQ(latest["step"], 5);
  // The export is a loadable bf16 drafter equal to the trained weights (rounded).
  Drafter d = load_drafter(out.string());
  EXPECT_EQ(read_drafter_json(out.string())["dtype"], "bf16");
  EXPECT_TRUE(at::allclose(d.params().at("fc.weight"),
                           t.drafter().params().at("fc.weight").detach().to(at::kBFloat16).to(at::kFloat)));
  int lines = 0, evals = 0;
  std::ifstream m(out / "metrics.jsonl");
  for (std::string line; std::getline(m, line);) {
    auto j = nlohmann::json::parse(line);
    ++lines;
    evals += j.contains("eval_step");
  }
  EXPECT_EQ(evals, 3);  // steps 2, 4 and the final one
  EXPECT_GE(lines, 4);
  // The fp32 checkpoint resumes at step 5 and a longer run continues from it;
  // the leftover of an interrupted save is cleaned up.
  fs::create_directories(out / "checkpoints" / "step-00000001.partial");
  test::write_bytes((out / "checkpoints" / "step-00000001.partial" / "x").string(), "junk");
  c.resume = true;
  c.steps = 6;
  Trainer t2(c, *s.target);
  EXPECT_EQ(t2.steps_done(), 5);
  t2.run();
  EXPECT_FALSE(fs::exists(out / "checkpoints" / "step-00000001.partial"));
  EXPECT_FALSE(fs::exists(out / "checkpoints" / "step-00000004"));
  EXPECT_TRUE(fs::exists(out / "checkpoints" / "step-00000006"));
  latest = nlohmann::json::parse(test::read_bytes((out / "checkpoints" / "latest.json").string()));
  EXPECT_EQ(latest["step"], 6);
}

// Training on a draft vocabulary end to end: fresh drafter, export carrying
// the vocabulary, an --init drafter without one adopting it, and mismatches
// refused.
TEST(TrainTrainer, TrainsOnADraftVocabulary) {
  TinySetup s;
  const std::string data = s.dir.file("data");
  const int64_t V = s.target->info().vocab;
  write_dataset(data, s.target->info().id, random_sequences(40, 24, 5, 60, 6));  // tokens 3..59
  const DraftVocab dv = select_draft_vocab(TrainDataset::load(data), 40, V, {1, 2});
  ASSERT_EQ(dv.ids.size(), 40u);
  ASSERT_LT(dv.coverage(), 1.0);  // some labels fall outside

  TrainConfig c = s.config(data, s.dir.file("out"));
  c.drafter.draft_vocab = dv.ids;
  c.steps = 3;
  Trainer t(c, *s.target);
  EXPECT_EQ(t.drafter().config().draft_vocab, dv.ids);
  EvalStats ev = t.run();
  EXPECT_GT(ev.acceptance.anchors, 0);
  EXPECT_GE(ev.acceptance.mean_tau_greedy(), 1.0);
  EXPECT_TRUE(std::isfinite(ev.loss));
  EXPECT_GT(ev.l1, 0.0);
  Drafter d = load_drafter(s.dir.file("out"));
  EXPECT_EQ(d.config().draft_vocab, dv.ids);
  d.bind(*s.target);  // the export drafts on the same vocabulary
  // Output rows outside the draft vocabulary are untouched by training.
  Drafter fresh = Drafter::init(t.drafter().config(), c.seed);
  const at::Tensor w2 = t.drafter().params().at("markov_w2.weight").detach();
  EXPECT_TRUE(at::equal(w2[0], fresh.params().at("markov_w2.weight")[0]));  // id 0 is not in the vocabulary
  EXPECT_FALSE(at::equal(w2[dv.ids[5]], fresh.params().at("markov_w2.weight")[dv.ids[5]]));

  // An init drafter without a draft vocabulary takes the configured one.
  {
    DrafterConfig dc = c.drafter;
    dc.draft_vocab.clear();
    dc.complete_from(s.target->info());
    save_drafter(Drafter::init(dc, 1), s.dir.file("init"), /*bf16=*/false);
  }
  TrainConfig ci = s.config(data, s.dir.file("out2"));
  ci.init_drafter = s.dir.file("init");
  ci.drafter.draft_vocab = dv.ids;
  ci.steps = 1;
  Trainer ti(ci, *s.target);
  EXPECT_EQ(ti.drafter().config().draft_vocab, dv.ids);
  ti.step();
  // ... but a different one than the init drafter's own is refused, and so
  // is a resume asking for another.
  TrainConfig cm = ci;
  cm.init_drafter = s.dir.file("out");
  cm.drafter.draft_vocab = {1, 2, 3};
  EXPECT_THROW(Trainer(cm, *s.target), InvalidArgument);
  TrainConfig cr = c;
  cr.resume = true;
  cr.steps = 4;
  cr.drafter.draft_vocab = {1, 2, 3};
  EXPECT_THROW(Trainer(cr, *s.target), InvalidArgument);
  cr.drafter.draft_vocab.clear();  // the checkpoint's own applies
  Trainer tr(cr, *s.target);
  EXPECT_EQ(tr.drafter().config().draft_vocab, dv.ids);
}

// The computation of a GPU run (`--device cuda`), on the CPU (`--aten-only`):
// the target as AtenForward and every product in ATen ops train like the
// kernels to rounding, on the full and on a draft vocabulary, and resume bit
// for bit. With a CUDA device the same run there agrees with it (else that
// part is skipped, and asking for CUDA is a clear error).
TEST(TrainTrainer, AtenOnlyTrainsLikeTheKernels) {
  TinySetup s;
  const std::string data = s.dir.file("data");
  write_dataset(data, s.target->info().id, random_sequences(6, 30, 6, 60, 8));  // tokens 3..59
  const DraftVocab dv = select_draft_vocab(TrainDataset::load(data), 40, s.target->info().vocab, {1, 2});
  struct Run {
    std::vector<double> losses;
    double tau = 0;
  };
  auto run = [&](TrainConfig c) {
    Trainer t(c, *s.target);
    Run r;
    for (int i = 0; i < 4; ++i) r.losses.push_back(t.step().loss);
    r.tau = t.evaluate().acceptance.mean_tau_greedy();
    return r;
  };
  int n = 0;
  for (const bool draft : {false, true}) {
    SCOPED_TRACE(draft ? "draft vocabulary" : "full vocabulary");
    TrainConfig c = s.config(data, s.dir.file("k" + std::to_string(n++)));
    if (draft) c.drafter.draft_vocab = dv.ids;
    const Run kernels = run(c);
    c.out_dir = s.dir.file("a" + std::to_string(n++));
    c.aten_only = true;
    const Run aten = run(c);
    for (size_t k = 0; k < kernels.losses.size(); ++k)
      EXPECT_NEAR(aten.losses[k], kernels.losses[k], 0.01 * kernels.losses[k]) << "step " << k;
    EXPECT_NEAR(aten.tau, kernels.tau, 0.15);
    if (torch::cuda::is_available()) {
      c.out_dir = s.dir.file("c" + std::to_string(n++));
      c.device = "cuda";
      const Run cuda = run(c);
      for (size_t k = 0; k < aten.losses.size(); ++k)
        EXPECT_NEAR(cuda.losses[k], aten.losses[k], 0.01 * aten.losses[k]) << "step " << k;
    }
  }
  // Resume: 2 steps, a checkpoint, 2 more equal 4 uninterrupted steps.
  TrainConfig c = s.config(data, s.dir.file("r"));
  c.aten_only = true;
  const Run whole = run(c);
  EXPECT_EQ(test::losses(test::run_steps_with_resume(c, *s.target, 2, 2)), whole.losses);
  // Device names.
  TrainConfig bad = s.config(data, s.dir.file("bad"));
  for (const char* name : {"tpu", "cuda:x", "", "cpu:"}) {
    bad.device = name;
    EXPECT_THROW(Trainer(bad, *s.target), InvalidArgument) << name;
  }
  if (!torch::cuda::is_available()) {
    bad.device = "cuda";
    try {
      Trainer tb(bad, *s.target);
      FAIL() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("CUDA"), std::string::npos) << e.what();
    }
  }
}

TEST(TrainTrainer, RejectsDataOfAnotherTarget) {
  TinySetup s;
  const std::string data = s.dir.file("data");
  write_dataset(data, "llama/another", random_sequences(3, 20, 4, 50, 1));
  EXPECT_THROW(Trainer(s.config(data, s.dir.file("o")), *s.target), InvalidArgument);
  write_dataset(data, s.target->info().id, random_sequences(3, 20, 20, 50, 1));  // nothing supervised
  EXPECT_THROW(Trainer(s.config(data, s.dir.file("o")), *s.target), Error);
}

// ---- overfit proof ---------------------------------------------------------------------

// Builds sequences prompt + the target's greedy continuation (supervised).
std::vector<TrainSequence> greedy_sequences(TargetModel& target, const std::vector<std::vector<TokenId>>& prompts,
                                            int64_t n_predict, const std::vector<TokenId>& stop_ids) {
  std::vector<TrainSequence> out;
  for (const auto& p : prompts) {
    GenerateOptions o;
    o.n_predict = n_predict;
    o.sampling.temperature = 0.f;
    o.stop_ids = stop_ids;
    GenerateResult r = generate_plain(target, p, o);
    TrainSequence s;
    s.tokens = p;
    s.tokens.insert(s.tokens.end(), r.tokens.begin(), r.tokens.end());
    s.loss_mask.assign(p.size(), 0);
    s.loss_mask.resize(s.tokens.size(), 1);
    out.push_back(std::move(s));
  }
  return out;
}

// Mean τ of greedy speculative decoding over the prompts; checks losslessness.
double speculative_tau(TargetModel& target, Drafter& drafter, const std::vector<std::vector<TokenId>>& prompts,
                       const std::vector<TrainSequence>& seqs, int64_t n_predict,
                       const std::vector<TokenId>& stop_ids) {
  c10::NoGradGuard ng;
  drafter.bind(target);
  int64_t emitted = 0, rounds = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateOptions o;
    o.n_predict = n_predict;
    o.sampling.temperature = 0.f;
    o.stop_ids = stop_ids;
    SpecOptions so;
    so.prune = false;
    GenerateResult r = generate_speculative(target, drafter, prompts[i], o, so);
    std::vector<TokenId> expect(seqs[i].tokens.begin() + static_cast<std::ptrdiff_t>(prompts[i].size()),
                                seqs[i].tokens.end());
    EXPECT_EQ(r.tokens, expect) << "speculative output differs from plain greedy";
    emitted += r.stats.accepted + r.stats.rounds;
    rounds += r.stats.rounds;
  }
  // GenerateStats::tau() over all prompts: tokens per verification call.
  return rounds ? static_cast<double>(emitted) / static_cast<double>(rounds) : 0.0;
}

struct OverfitResult {
  double tau_before = 0, tau_after = 0, eval_tau = 0, seconds = 0;
  size_t distinct_tokens = 0;  // distinct token ids in the continuations
};

// With draft_vocab > 0 the drafter gets a draft vocabulary of that many
// tokens chosen from the data (select_draft_vocab).
OverfitResult overfit(TargetModel& target, const std::vector<std::vector<TokenId>>& prompts, int64_t n_predict,
                      const std::vector<TokenId>& stop_ids, TrainConfig c, const std::string& work,
                      int64_t draft_vocab = 0) {
  auto seqs = greedy_sequences(target, prompts, n_predict, stop_ids);
  std::set<TokenId> distinct;
  for (size_t i = 0; i < seqs.size(); ++i)
    distinct.insert(seqs[i].tokens.begin() + static_cast<std::ptrdiff_t>(prompts[i].size()), seqs[i].tokens.end());
  write_dataset(work + "/data", target.info().id, seqs);
  if (draft_vocab > 0)
    c.drafter.draft_vocab =
        select_draft_vocab(TrainDataset::load(work + "/data"), draft_vocab, target.info().vocab, stop_ids).ids;
  c.data_dirs = {work + "/data"};
  c.out_dir = work + "/out";
  const auto t0 = std::chrono::steady_clock::now();
  Trainer t(c, target);
  OverfitResult r;
  r.distinct_tokens = distinct.size();
  r.tau_before = speculative_tau(target, t.drafter(), prompts, seqs, n_predict, stop_ids);
  r.eval_tau = t.run().acceptance.mean_tau_greedy();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.tau_after = speculative_tau(target, t.drafter(), prompts, seqs, n_predict, stop_ids);
  return r;
}

TEST(TrainOverfit, TinyTargetThreeSequencesReachTau3) {
  TinySetup s(77);
  std::mt19937_64 rng(11);
  std::vector<std::vector<TokenId>> prompts(3);
  for (auto& p : prompts)
    for (int i = 0; i < 8; ++i) p.push_back(static_cast<TokenId>(3 + rng() % 256));
  TrainConfig c;
  c.drafter.gamma = 6;
  c.drafter.n_layers = 1;
  c.drafter.seq_head = SeqHead::Markov;
  c.steps = 150;
  c.batch = 48;
  c.anchors_per_seq = 16;
  c.lr = 3e-3;
  c.save_every = 0;
  c.eval_every = 0;
  c.feature_cache_mb = 64;
  c.progress = Progress::None;
  OverfitResult r = overfit(*s.target, prompts, 40, {}, c, s.dir.path().string());
  EXPECT_GE(r.distinct_tokens, 20) << "the target's continuations are too repetitive to prove anything";
  std::printf("[overfit tiny] %zu distinct tokens; tau before %.2f, after %.2f (teacher-forced estimate %.2f), %.1f s\n",
              r.distinct_tokens, r.tau_before, r.tau_after, r.eval_tau, r.seconds);
  EXPECT_GE(r.tau_after, 3.0);
  EXPECT_GT(r.tau_after, r.tau_before);
}

// The same with a draft vocabulary that covers the continuations (a quarter
// of the vocabulary): the drafter trained on it drafts on it at inference.
TEST(TrainOverfit, TinyTargetDraftVocabReachesTau3) {
  TinySetup s(77);
  std::mt19937_64 rng(11);
  std::vector<std::vector<TokenId>> prompts(3);
  for (auto& p : prompts)
    for (int i = 0; i < 8; ++i) p.push_back(static_cast<TokenId>(3 + rng() % 256));
  TrainConfig c;
  c.drafter.gamma = 6;
  c.drafter.n_layers = 1;
  c.drafter.seq_head = SeqHead::Markov;
  c.steps = 150;
  c.batch = 48;
  c.anchors_per_seq = 16;
  c.lr = 3e-3;
  c.save_every = 0;
  c.eval_every = 0;
  c.feature_cache_mb = 64;
  c.progress = Progress::None;
  OverfitResult r = overfit(*s.target, prompts, 40, {}, c, s.dir.path().string(), /*draft_vocab=*/64);
  ASSERT_LE(r.distinct_tokens, 64u);
  std::printf("[overfit tiny, draft vocab 64] tau before %.2f, after %.2f (teacher-forced estimate %.2f), %.1f s\n",
              r.tau_before, r.tau_after, r.eval_tau, r.seconds);
  EXPECT_GE(r.tau_after, 3.0);
}

TEST(TrainOverfit, SmolLM2ThreeSequencesReachTau3) {
  if (!full_mode()) GTEST_SKIP() << "set DSPARK_TEST_FULL=1 to run the SmolLM2 overfit proof";
  DSPARK_REQUIRE_MODEL();
  LoadedModel m = LoadedModel::load(test::model_path());
  at::set_num_threads(2);
  std::vector<std::vector<TokenId>> prompts = {
      m.encode_prompt("What is the capital of France?", true),
      m.encode_prompt("Write a haiku about the sea.", true),
      m.encode_prompt("List three primary colors.", true),
  };
  TrainConfig c;
  c.drafter.gamma = 7;
  c.drafter.n_layers = 1;
  c.drafter.seq_head = SeqHead::Markov;
  c.steps = 120;
  c.batch = 48;
  c.anchors_per_seq = 16;
  c.lr = 2e-3;
  c.save_every = 0;
  c.eval_every = 0;
  c.feature_cache_mb = 256;
  c.progress = Progress::None;
  test::TempDir dir;
  OverfitResult r = overfit(*m.target, prompts, 48, m.stop_ids, c, dir.path().string());
  std::printf("[overfit smollm2] tau before %.2f, after %.2f (teacher-forced estimate %.2f), %.1f s\n",
              r.tau_before, r.tau_after, r.eval_tau, r.seconds);
  EXPECT_GE(r.tau_after, 3.0);
}

}  // namespace
