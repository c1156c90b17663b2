// The family suite: one set of tests run over every target family on tiny
// random models written by the tests (Llama; Gemma 3 with sliding-window
// layers and Qwen3 with per-head q/k norms, each on bf16 and on quantized
// Q8_0 weights). Each checks what
// speculative decoding relies on: shapes, cached vs uncached decode, a
// ragged batch vs each sequence alone (bitwise), rollback (trim) including
// past a full, wrapped sliding window, and greedy speculative decoding with
// random and oracle drafters equal to plain decoding on prompts longer than
// the window. Adding a family means adding its tiny model to kFamilies.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "dspark/error.hpp"
#include "dspark/model/aten_forward.hpp"
#include "dspark/model/target.hpp"
#include "dspark/speculative/speculative.hpp"
#include "spec_test_util.hpp"
#include "target_checks.hpp"
#include "test_util.hpp"

namespace {

using namespace dspark::test;  // TargetModel, KVCache, Logits, ... (target_checks.hpp)

struct Family {
  std::string name;
  dspark::ops::Compute compute;
  std::function<void(const std::string& path)> write;
};

const std::vector<Family>& families() {
  static const std::vector<Family> f = {
      {"llama", dspark::ops::Compute::BF16, [](const std::string& p) { write_tiny_llama(p, 42); }},
      {"gemma3", dspark::ops::Compute::BF16, [](const std::string& p) { write_tiny_gemma(p, 42); }},
      {"gemma3_q8_0", dspark::ops::Compute::Quant,
       [](const std::string& p) {
         TinyGemmaOptions o;
         o.weight_type = dspark::io::GGMLType::Q8_0;
         write_tiny_gemma(p, 43, o);
       }},
      {"qwen3", dspark::ops::Compute::BF16, [](const std::string& p) { write_tiny_qwen3(p, 42); }},
      {"qwen3_q8_0", dspark::ops::Compute::Quant,
       [](const std::string& p) {
         TinyQwen3Options o;
         o.weight_type = dspark::io::GGMLType::Q8_0;
         o.tied_embeddings = false;
         write_tiny_qwen3(p, 43, o);
       }},
  };
  return f;
}

class FamilySuite : public ::testing::TestWithParam<size_t> {
 protected:
  static TargetModel& model(size_t i) {
    static TempDir dir;
    static std::vector<std::unique_ptr<TargetModel>> models(families().size());
    if (!models[i]) {
      const std::string path = dir.file(families()[i].name + ".gguf");
      families()[i].write(path);
      models[i] = dspark::load_target(path, families()[i].compute);
    }
    return *models[i];
  }
  TargetModel& m() { return model(GetParam()); }
  // Smallest sliding window of the model (0: none).
  int64_t window() {
    int64_t w = 0;
    for (int64_t x : m().info().layer_window)
      if (x > 0) w = w == 0 ? x : std::min(w, x);
    return w;
  }
  std::vector<TokenId> tokens(size_t n, uint32_t seed) {
    const uint32_t V = static_cast<uint32_t>(m().info().vocab);
    std::vector<TokenId> t(n);
    for (size_t i = 0; i < n; ++i) t[i] = static_cast<TokenId>((seed * 2654435761u + i * 40503u) % V);
    return t;
  }
};

TEST_P(FamilySuite, ShapesAndEmbedding) {
  const auto& i = m().info();
  EXPECT_EQ(static_cast<int64_t>(i.layer_window.size()), i.n_layers);
  KVCache c = m().new_cache();
  const auto toks = tokens(5, 1);
  const auto out = m().forward_one(c, toks, Logits::All, TapRequest{{0}, true});
  EXPECT_EQ(out.logits.sizes(), (at::IntArrayRef{5, i.vocab}));
  EXPECT_EQ(out.taps.sizes(), (at::IntArrayRef{5, i.hidden}));
  EXPECT_EQ(out.final_hidden.sizes(), (at::IntArrayRef{5, i.hidden}));
  // embed() is the table row times the family's scale; embedding() holds the same rows in bf16.
  std::vector<float> x(static_cast<size_t>(i.hidden)), row(x.size());
  m().embed(std::span<const TokenId>(&toks[2], 1), x.data());
  m().embedding_table().row_f32(toks[2], row.data());
  for (int64_t k = 0; k < i.hidden; ++k) {
    ASSERT_EQ(x[k], row[k] * static_cast<float>(i.embed_scale)) << k;
    ASSERT_NEAR(m().embedding()[toks[2]][k].item<float>(), x[k], 0.01 * std::fabs(x[k]) + 1e-6) << k;
  }
}

TEST_P(FamilySuite, PrefillEqualsIncremental) {
  check_prefill_equals_incremental(m(), tokens(std::max<int64_t>(11, 2 * window() + 5), 2));
}

TEST_P(FamilySuite, TrimThenReforwardEqualsFreshPrefill) {
  const size_t past = static_cast<size_t>(2 * window() + 3);  // the window has filled and wrapped
  check_trim_then_reforward(m(), tokens(7, 3), tokens(5, 4), tokens(4, 5));
  check_trim_then_reforward(m(), tokens(1, 6), tokens(1, 7), tokens(1, 8));
  check_trim_then_reforward(m(), tokens(past, 9), tokens(9, 10), tokens(6, 11));
}

// Token by token far past the window (the rings wrap many times), then a
// draft block, a rollback and another block: equal to a fresh prefill of what
// was kept. Rolling back further than the rings can restore is refused and
// leaves the cache as it was.
TEST_P(FamilySuite, RollbackAfterTheWindowWrapped) {
  const auto prefix = tokens(150, 12);
  KVCache c = m().new_cache();
  for (TokenId t : prefix) m().forward_one(c, std::span<const TokenId>(&t, 1), Logits::None);
  const auto draft = tokens(9, 13), accepted = tokens(3, 14);
  m().forward_one(c, draft, Logits::All);
  c.trim(static_cast<int64_t>(draft.size()));
  const auto after = m().forward_one(c, accepted, Logits::All).logits;
  KVCache fresh = m().new_cache();
  const auto ref = m().forward_one(fresh, concat(prefix, accepted), Logits::All).logits;
  EXPECT_TRUE(same_bits(after, ref.narrow(0, 150, 3)));
  for (int64_t l = 0; l < m().info().n_layers; ++l) {
    if (c.window(l) > 0) {
      EXPECT_LE(c.capacity(l), c.window(l) - 1 + 64) << "layer " << l << ": the ring stays bounded";
    } else {
      EXPECT_GE(c.capacity(l), c.size()) << "layer " << l;
    }
  }
  const int64_t size = c.size();
  if (window() > 0) {
    EXPECT_THROW(c.trim(100), InvalidArgument) << "keys of position ~50 were overwritten long ago";
    EXPECT_EQ(c.size(), size);
  } else {
    EXPECT_NO_THROW(c.trim(100));
  }
}

TEST_P(FamilySuite, BatchEqualsEachAlone) {
  const size_t w = static_cast<size_t>(window());
  check_batch_equals_alone(m(), {tokens(3, 10), {}, tokens(6 + w, 11)}, {tokens(5, 12), tokens(1, 13), tokens(8, 14)},
                           TapRequest{});
  check_batch_equals_alone(m(), {tokens(2, 20), tokens(9 + 2 * w, 21), {}, tokens(1, 22)},
                           {tokens(4, 23), tokens(2, 24), tokens(7 + w, 25), tokens(3, 26)}, TapRequest{{1, 0}, true});
}

TEST_P(FamilySuite, HiddenTaps) { check_taps(m(), tokens(6 + static_cast<size_t>(window()), 30), {0, 1}); }

TEST_P(FamilySuite, ErrorsLeaveCachesUnchanged) { check_errors(m()); }

// Greedy speculative decoding equals plain decoding token for token, with
// random drafters (two head types) and oracle drafters that know the plain
// continuation (perfect, noisy, always wrong), on prompts longer than the
// sliding window, generating past several windows.
TEST_P(FamilySuite, GreedySpeculativeEqualsPlain) {
  using dspark::spectest::OracleDrafter;
  const int64_t n = 40;
  for (size_t p = 0; p < 2; ++p) {
    const auto prompt = tokens(static_cast<size_t>(3 * window() + 5 + 7 * p), static_cast<uint32_t>(40 + p));
    const auto opts = dspark::spectest::greedy_options(n, {});
    const auto plain = dspark::generate_plain(m(), prompt, opts);
    ASSERT_EQ(static_cast<int64_t>(plain.tokens.size()), n);
    for (auto head : {dspark::SeqHead::Markov, dspark::SeqHead::Rnn}) {
      const auto drafter = dspark::spectest::random_drafter(m(), head, 99 + p);
      dspark::SpecOptions so;
      so.gamma = 5;
      const auto spec = dspark::generate_speculative(m(), drafter, prompt, opts, so);
      EXPECT_EQ(dspark::spectest::compare_runs(plain, spec), "") << "random drafter, head " << to_string(head);
    }
    for (auto kind : {OracleDrafter::Kind::Perfect, OracleDrafter::Kind::Noisy, OracleDrafter::Kind::Wrong}) {
      OracleDrafter oracle(kind, plain.tokens, static_cast<int64_t>(prompt.size()), m().info().vocab);
      oracle.set_gamma(6);
      const auto spec = dspark::generate_speculative(m(), oracle, prompt, opts, {});
      EXPECT_EQ(dspark::spectest::compare_runs(plain, spec), "") << "oracle kind " << static_cast<int>(kind);
      if (kind == OracleDrafter::Kind::Perfect) {
        EXPECT_EQ(spec.stats.accepted, spec.stats.drafted);
        EXPECT_GT(spec.stats.tau(), 5.0);
      }
    }
  }
}

// Largest |a - ref| over the largest |ref|.
double rel_error(const at::Tensor& a, const at::Tensor& ref) {
  return (a - ref).abs().max().item<double>() / ref.abs().max().item<double>();
}

// The ATen forward (what training runs on a GPU) computes what the kernels
// compute, to rounding: every layer's output, the final hidden and the
// logits, on a sequence past the sliding window. The kernels round matmul
// inputs to bf16 (or int8 on quantized weights), so fp32 ATen weights agree
// to about 1e-2 of the largest value; a swapped RoPE layout, a missing norm
// or a wrong window gives errors of order 1.
TEST_P(FamilySuite, AtenForwardMatchesTheKernels) {
  const auto& i = m().info();
  const auto toks = tokens(static_cast<size_t>(2 * window() + 9), 50);
  std::vector<int> all(static_cast<size_t>(i.n_layers));
  std::iota(all.begin(), all.end(), 0);
  KVCache c = m().new_cache();
  const auto ref = m().forward_one(c, toks, Logits::All, TapRequest{all, true});
  const bool quant = families()[GetParam()].compute == dspark::ops::Compute::Quant;
  for (const auto wt : {at::kFloat, at::kBFloat16}) {
    SCOPED_TRACE(c10::toString(wt));
    const dspark::AtenForward af(m(), {at::kCPU, wt});
    const auto out = af.forward(toks, Logits::All, TapRequest{all, true});
    ASSERT_EQ(out.taps.sizes(), ref.taps.sizes());
    ASSERT_EQ(out.logits.sizes(), ref.logits.sizes());
    const double tol = (wt == at::kFloat ? 0.015 : 0.025) + (quant ? 0.02 : 0.0);
    for (int64_t l = 0; l < i.n_layers; ++l) {
      const auto cols = [&](const at::Tensor& t) { return t.narrow(1, l * i.hidden, i.hidden); };
      EXPECT_LT(rel_error(cols(out.taps), cols(ref.taps)), tol) << "layer " << l;
    }
    EXPECT_LT(rel_error(out.final_hidden, ref.final_hidden), tol);
    EXPECT_LT(rel_error(out.logits, ref.logits), tol);
    // The greedy token agrees wherever the kernels' top two logits are
    // further apart than the largest logit difference allows to swap.
    const auto top2 = std::get<0>(ref.logits.topk(2, -1));
    const auto clear = (top2.select(1, 0) - top2.select(1, 1)) > 2 * (out.logits - ref.logits).abs().max();
    EXPECT_GT((clear.sum().item<int64_t>()), 0);
    EXPECT_TRUE(at::equal(out.logits.argmax(-1).masked_select(clear), ref.logits.argmax(-1).masked_select(clear)));
    // Logits::Last is the last row of Logits::All (to rounding: ATen's
    // products are not batch-invariant); no logits asked, none given.
    EXPECT_TRUE(at::allclose(af.forward(toks, Logits::Last).logits, out.logits.narrow(0, out.logits.size(0) - 1, 1),
                             1e-4, 1e-4));
    EXPECT_FALSE(af.forward(toks, Logits::None).logits.defined());
  }
  const dspark::AtenForward af(m(), {at::kCPU, at::kFloat});
  EXPECT_THROW(af.forward(std::vector<TokenId>{}, Logits::Last), InvalidArgument);
  EXPECT_THROW(af.forward(std::vector<TokenId>{0, static_cast<TokenId>(i.vocab)}, Logits::Last), InvalidArgument);
  EXPECT_THROW(af.forward(toks, Logits::None, TapRequest{{static_cast<int>(i.n_layers)}, false}), InvalidArgument);
  EXPECT_THROW(m().layer_recipe(i.n_layers), InvalidArgument);
  EXPECT_THROW(dspark::AtenForward(m(), {at::kCPU, at::kHalf}), InvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Families, FamilySuite, ::testing::Range<size_t>(0, families().size()),
                         [](const auto& info) { return families()[info.param].name; });

}  // namespace
