// Tests for the trainer's levers beyond the defaults, on a tiny random Llama:
//  - anchors re-drawn every epoch or fixed, seeded, and resumable mid-epoch;
//  - Muon: the update of a hidden matrix is an orthogonalized one, runs on
//    the ATen path like on the kernels, resumes bit for bit, and a resume
//    with another optimizer is refused;
//  - the forward KL term trains and is reported;
//  - drafters of 2 and 3 layers: training, the bf16 export, GGUF and HF
//    export/import (bit-identical) and lossless speculative decoding;
//  - growing an init drafter by layers that start as the identity;
//  - filling the disk feature cache so that training never runs the target.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "dspark/error.hpp"
#include "dspark/speculative/checkpoint.hpp"
#include "dspark/speculative/generate.hpp"
#include "dspark/speculative/interop.hpp"
#include "dspark/speculative/speculative.hpp"
#include "dspark/train/data.hpp"
#include "dspark/train/optimizer.hpp"
#include "dspark/train/trainer.hpp"
#include "spec_test_util.hpp"
#include "train_test_util.hpp"

namespace {

using namespace dspark;
using namespace dspark::train;
using test::random_sequences;
using test::TinySetup;
namespace fs = std::filesystem;

// ---- anchors -------------------------------------------------------------------

// Anchor sets of every visit, per sequence, in visit order.
using Visits = std::map<size_t, std::vector<std::vector<int64_t>>>;

void record(Visits& v, const StepStats& st) {
  for (const auto& g : st.groups) v[g.sequence].push_back(g.anchors);
}

TEST(TrainLevers, AnchorsAreRedrawnEachEpochOrFixedSeededAndResumable) {
  TinySetup s;
  const std::string data = s.dir.file("data");
  // 3 sequences of 34 eligible anchors; one sequence (4 anchors) per step,
  // so an epoch is 3 steps.
  write_dataset(data, s.target->info().id, random_sequences(3, 40, 5, s.target->info().vocab, 9));
  auto run = [&](AnchorDraw draw, uint64_t seed, int steps, int batch) {
    TrainConfig c = s.config(data, s.dir.file("out"));
    c.anchors = draw;
    c.seed = seed;
    c.batch = batch;
    c.anchors_per_seq = 4;
    c.steps = steps;
    Trainer t(c, *s.target);
    Visits v;
    for (int i = 0; i < steps; ++i) record(v, t.step());
    return v;
  };
  const Visits redraw = run(AnchorDraw::Redraw, 5, 9, 4), fixed = run(AnchorDraw::Fixed, 5, 9, 4);
  ASSERT_EQ(redraw.size(), 3u);
  ASSERT_EQ(fixed.size(), 3u);
  for (const auto& [seq, sets] : redraw) {
    ASSERT_EQ(sets.size(), 3u) << "one visit per epoch";
    EXPECT_NE(sets[0], sets[1]) << "sequence " << seq;
    EXPECT_NE(sets[1], sets[2]) << "sequence " << seq;
    EXPECT_NE(sets[0], sets[2]) << "sequence " << seq;
  }
  for (const auto& [seq, sets] : fixed) {
    ASSERT_EQ(sets.size(), 3u);
    EXPECT_EQ(sets[0].size(), 4u);
    EXPECT_EQ(sets[0], sets[1]) << "sequence " << seq;
    EXPECT_EQ(sets[0], sets[2]) << "sequence " << seq;
  }
  // Seeded: the same seed draws the same, another seed others.
  EXPECT_EQ(run(AnchorDraw::Redraw, 5, 9, 4), redraw);
  EXPECT_EQ(run(AnchorDraw::Fixed, 5, 9, 4), fixed);
  EXPECT_NE(run(AnchorDraw::Fixed, 6, 9, 4).at(0)[0], fixed.at(0)[0]);
  // A fixed draw cut short by the end of a batch (6 = 4 + 2) is a subset of
  // the sequence's full draw.
  for (const auto& [seq, sets] : run(AnchorDraw::Fixed, 5, 6, 6))
    for (const auto& a : sets) {
      const std::set<int64_t> full(fixed.at(seq)[0].begin(), fixed.at(seq)[0].end());
      for (int64_t p : a) EXPECT_TRUE(full.count(p)) << "sequence " << seq << " anchor " << p;
    }

  // Resumed mid-epoch (after 4 steps: epoch 1, one sequence in), both draws
  // continue exactly as an uninterrupted run.
  for (const AnchorDraw draw : {AnchorDraw::Redraw, AnchorDraw::Fixed}) {
    SCOPED_TRACE(to_string(draw));
    TrainConfig c = s.config(data, s.dir.file("resume-" + to_string(draw)));
    c.anchors = draw;
    c.batch = 4;
    c.anchors_per_seq = 4;
    c.steps = 9;
    TrainConfig cw = c;
    cw.out_dir = s.dir.file("whole-" + to_string(draw));
    const auto whole = test::run_steps(cw, *s.target, 9);
    const auto parts = test::run_steps_with_resume(c, *s.target, 4, 5);
    Visits vw, vp;
    for (const auto& st : whole) record(vw, st);
    for (const auto& st : parts) record(vp, st);
    EXPECT_EQ(vp, vw);
    EXPECT_EQ(test::losses(parts), test::losses(whole));
    c.resume = true;
    EXPECT_EQ(Trainer(c, *s.target).epoch(), 1);  // 4 steps of one sequence, 3 sequences an epoch
    // Another draw on resume is refused, naming it.
    c.anchors = draw == AnchorDraw::Fixed ? AnchorDraw::Redraw : AnchorDraw::Fixed;
    // (the identity of a fixed draw names it; redraw, the default, is implied)
    EXPECT_MENTIONS(test::message_of<InvalidArgument>([&] { Trainer bad(c, *s.target); }), "\"anchors\":\"fixed\"");
  }
}

// ---- Muon ------------------------------------------------------------------------

TEST(TrainLevers, MuonUpdatesHiddenMatricesOrthogonallyAndResumes) {
  TinySetup s;
  const std::string data = s.dir.file("data");
  write_dataset(data, s.target->info().id, random_sequences(6, 30, 6, s.target->info().vocab, 8));
  TrainConfig c = s.config(data, s.dir.file("m"));
  c.optimizer = OptimizerKind::Muon;
  c.muon_lr = 0.02;
  c.lr = 1e-3;
  c.warmup = 0;

  // The first step of a hidden matrix: ΔW = −η·s·NS₅(U), so the singular
  // values of ΔW/(η·s) are at most ~1.2 and the largest is near 1 (NS₅ maps
  // the gradient's large singular values into about [0.68, 1.2]); AdamW's first
  // step, ±η in every entry, would have a largest one of about
  // sqrt(rows) + sqrt(cols).
  {
    Trainer t(c, *s.target);
    std::map<std::string, at::Tensor> before;
    for (const auto& [name, p] : t.drafter().params()) before[name] = p.detach().clone();
    t.step();
    for (const char* name : {"fc.weight", "layers.0.attn_q.weight", "layers.0.ffn_down.weight"}) {
      SCOPED_TRACE(name);
      const at::Tensor d = t.drafter().params().at(name).detach() - before.at(name);
      const double eta = c.muon_lr * muon_lr_factor(d.size(0), d.size(1), c.muon_lr_scale);
      const at::Tensor sv = at::linalg_svdvals(d.to(at::kDouble) / -eta);
      EXPECT_GT(sv.max().item<double>(), 0.6);
      EXPECT_LT(sv.max().item<double>(), 1.25);
    }
    // A norm weight is AdamW's: its first step moves each entry by about lr.
    const at::Tensor dn = (t.drafter().params().at("output_norm.weight").detach() -
                           before.at("output_norm.weight")).abs();
    EXPECT_NEAR(dn.max().item<double>(), c.lr, 0.05 * c.lr);
  }

  // Resume: 2 steps, a checkpoint, 2 more equal 4 uninterrupted steps.
  TrainConfig cw = c;
  cw.out_dir = s.dir.file("w");
  const std::vector<double> whole = test::losses(test::run_steps(cw, *s.target, 4));
  EXPECT_EQ(test::losses(test::run_steps_with_resume(c, *s.target, 2, 2)), whole);
  TrainConfig cr = c;
  cr.resume = true;
  cr.optimizer = OptimizerKind::AdamW;
  EXPECT_MENTIONS(test::message_of<InvalidArgument>([&] { Trainer bad(cr, *s.target); }), "\"optimizer\":\"muon\"");

  // The ATen path (--aten-only, what --device cuda runs) trains like the
  // kernels; on a GPU too when one is visible.
  TrainConfig ca = c;
  ca.out_dir = s.dir.file("a");
  ca.aten_only = true;
  const std::vector<double> aten = test::losses(test::run_steps(ca, *s.target, 4));
  for (size_t k = 0; k < 4; ++k) EXPECT_NEAR(aten[k], whole[k], 0.01 * whole[k]) << "step " << k;
  if (torch::cuda::is_available()) {
    ca.out_dir = s.dir.file("cuda");
    ca.device = "cuda";
    Trainer t(ca, *s.target);
    for (size_t k = 0; k < 4; ++k) EXPECT_NEAR(t.step().loss, aten[k], 0.01 * aten[k]) << "cuda step " << k;
  }
}

// ---- loss terms --------------------------------------------------------------------

TEST(TrainLevers, ForwardKlTermTrainsAndIsReported) {
  TinySetup s;
  const std::string data = s.dir.file("data");
  write_dataset(data, s.target->info().id, random_sequences(6, 30, 6, s.target->info().vocab, 8));
  TrainConfig c = s.config(data, s.dir.file("kl"));
  c.loss.w_l1 = 0;
  c.loss.w_kl = 1.0;
  c.loss.gamma_decay = 0;  // equal position weights
  std::vector<double> kernel;
  {
    Trainer t(c, *s.target);
    for (int i = 0; i < 3; ++i) {
      const StepStats st = t.step();
      EXPECT_GT(st.kl, 0.0);
      EXPECT_DOUBLE_EQ(st.loss, c.loss.w_ce * st.ce + c.loss.w_bce * st.bce + c.loss.w_kl * st.kl);
      kernel.push_back(st.loss);
    }
    const EvalStats ev = t.evaluate();
    EXPECT_GT(ev.kl, 0.0);
  }
  c.out_dir = s.dir.file("kl-aten");
  c.aten_only = true;
  Trainer t(c, *s.target);
  for (size_t k = 0; k < 3; ++k) EXPECT_NEAR(t.step().loss, kernel[k], 0.01 * kernel[k]) << "step " << k;
  // All weights zero is refused.
  TrainConfig z = s.config(data, s.dir.file("z"));
  z.loss = LossOptions{0, 0, 0, 4.0, true, 0};
  EXPECT_THROW(Trainer(z, *s.target), InvalidArgument);
}

// ---- depth ---------------------------------------------------------------------------

// Greedy speculative decoding with `d` equals plain greedy decoding.
void expect_lossless(TargetModel& target, Drafter d) {
  d.bind(target);
  const std::vector<TokenId> prompt = {5, 17, 33, 99, 120, 7};
  GenerateOptions o;
  o.n_predict = 12;
  o.sampling.temperature = 0.f;
  const GenerateResult plain = generate_plain(target, prompt, o);
  SpecOptions so;
  so.prune = false;
  const GenerateResult spec = generate_speculative(target, d, prompt, o, so);
  EXPECT_EQ(spec.tokens, plain.tokens);
  EXPECT_GT(spec.stats.rounds, 0);
}

TEST(TrainLevers, TwoAndThreeLayerDraftersTrainExportImportAndDecode) {
  TinySetup s;
  const std::string data = s.dir.file("data");
  write_dataset(data, s.target->info().id, random_sequences(6, 30, 6, s.target->info().vocab, 8));
  for (const int layers : {2, 3}) {
    SCOPED_TRACE(std::to_string(layers) + " layers");
    const std::string out = s.dir.file("out" + std::to_string(layers));
    TrainConfig c = s.config(data, out);
    c.drafter.n_layers = layers;
    c.steps = 3;
    Trainer t(c, *s.target);
    const EvalStats ev = t.run();
    EXPECT_TRUE(std::isfinite(ev.loss));
    // Every layer trained (its output projection moved from its init).
    const Drafter init = Drafter::init(t.drafter().config(), c.seed);
    for (int i = 0; i < layers; ++i) {
      const std::string name = "layers." + std::to_string(i) + ".attn_output.weight";
      EXPECT_FALSE(at::equal(t.drafter().params().at(name).detach(), init.params().at(name))) << name;
    }
    // The bf16 export and the resumable fp32 checkpoint hold every layer.
    const Drafter shipped = load_drafter(out);
    EXPECT_EQ(shipped.config().n_layers, layers);
    EXPECT_EQ(shipped.params().size(), Drafter::param_spec(shipped.config()).size());
    TrainConfig cr = c;
    cr.resume = true;
    EXPECT_EQ(Trainer(cr, *s.target).drafter().config().n_layers, layers);
    // GGUF and HF round trips are bit-identical.
    for (const DrafterFormat f : {DrafterFormat::GGUF, DrafterFormat::HF}) {
      SCOPED_TRACE(to_string(f));
      const std::string path = out + (f == DrafterFormat::GGUF ? "/d.gguf" : "/hf");
      ExportOptions eo;
      eo.mask_row = 2;  // the tiny vocabulary's control tokens are all declared special ids
      export_drafter(shipped, s.target->info(), f, path, eo);
      const Drafter back = import_drafter(path, s.target->info(), f);
      EXPECT_EQ(back.config().n_layers, layers);
      for (const auto& [name, p] : shipped.params()) EXPECT_TRUE(at::equal(back.params().at(name), p)) << name;
    }
    expect_lossless(*s.target, shipped);
  }
}

// A grown drafter computes exactly what its init drafter computes, drafts
// the same, and training then moves the new layers.
TEST(TrainLevers, GrowingAddsLayersThatStartAsTheIdentity) {
  TinySetup s;
  const std::string data = s.dir.file("data");
  write_dataset(data, s.target->info().id, random_sequences(60, 30, 6, s.target->info().vocab, 8));
  // A 1-layer drafter with every parameter non-trivial (trained 3 steps).
  TrainConfig c1 = s.config(data, s.dir.file("one"));
  c1.steps = 3;
  Trainer(c1, *s.target).run();
  const Drafter one = load_drafter(s.dir.file("one"));
  const Drafter three = grow_drafter(one, 3, 7);
  EXPECT_EQ(three.config().n_layers, 3);
  EXPECT_TRUE(at::equal(three.params().at("layers.0.attn_q.weight"), one.params().at("layers.0.attn_q.weight")));
  EXPECT_EQ(three.params().at("layers.2.ffn_down.weight").abs().max().item<float>(), 0.f);
  EXPECT_GT(three.params().at("layers.2.attn_q.weight").abs().max().item<float>(), 0.f);
  EXPECT_THROW(grow_drafter(one, 1, 7), InvalidArgument);

  spectest::expect_same_drafts(one, three, *s.target);

  // Through the trainer (`--init one --layers 2`): the first evaluation
  // equals the init drafter's, then steps move the new layer.
  TrainConfig ce = s.config(data, s.dir.file("eval"));
  ce.init_drafter = s.dir.file("one");
  const double loss_one = Trainer(ce, *s.target).evaluate().loss;
  TrainConfig cg = ce;
  cg.out_dir = s.dir.file("grown");
  cg.grow_layers = 2;
  Trainer g(cg, *s.target);
  EXPECT_EQ(g.drafter().config().n_layers, 2);
  EXPECT_DOUBLE_EQ(g.evaluate().loss, loss_one);
  for (int i = 0; i < 2; ++i) g.step();
  EXPECT_GT(g.drafter().params().at("layers.1.attn_output.weight").abs().max().item<float>(), 0.f);
  // Growing to fewer layers than the init drafter has is refused.
  TrainConfig cs = ce;
  cs.init_drafter = s.dir.file("grown");
  g.save_checkpoint();
  cs.grow_layers = 1;
  EXPECT_THROW(Trainer(cs, *s.target), InvalidArgument);
}

// ---- durable state ---------------------------------------------------------------------

// --fill-feature-cache computes every training sequence once; a run over the
// filled cache never runs the target and trains exactly like a run without it.
TEST(TrainLevers, FilledFeatureCacheServesEveryStep) {
  TinySetup s;
  const std::string data = s.dir.file("data");
  write_dataset(data, s.target->info().id, random_sequences(5, 30, 6, s.target->info().vocab, 3));
  TrainConfig c = s.config(data, s.dir.file("a"));
  c.feature_cache_dir = s.dir.file("cache");
  {
    Trainer t(c, *s.target);
    EXPECT_EQ(t.fill_feature_cache(), 5);
    EXPECT_EQ(t.fill_feature_cache(), 0);  // nothing left to compute
  }
  std::vector<double> cached, plain;
  {
    Trainer t(c, *s.target);
    for (int i = 0; i < 4; ++i) {
      const StepStats st = t.step();
      EXPECT_EQ(st.tokens, 0) << "the target ran";
      cached.push_back(st.loss);
    }
  }
  TrainConfig cp = s.config(data, s.dir.file("b"));
  Trainer t(cp, *s.target);
  for (int i = 0; i < 4; ++i) plain.push_back(t.step().loss);
  EXPECT_EQ(cached, plain);
  EXPECT_THROW(t.fill_feature_cache(), InvalidArgument);  // no cache directory
}

}  // namespace
