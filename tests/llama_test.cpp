// Tests for the Llama-family target: loading from GGUF (metadata, weight
// encodings, errors), the forward pass against an independent ATen
// reference, every quantized weight type, and the properties speculative
// decoding relies on (target_checks.hpp) on the real SmolLM2-135M-Instruct
// model. The same properties on tiny random models of every family are the
// family suite's (family_test.cpp).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dspark/error.hpp"
#include "dspark/io/dequant.hpp"
#include "dspark/io/gguf.hpp"
#include "dspark/ops/kernels.hpp"
#include "dspark/model/target.hpp"
#include "target_checks.hpp"
#include "test_util.hpp"

namespace {

using dspark::FormatError;
using namespace dspark::test;  // TargetModel, KVCache, Logits, check_*, ... (target_checks.hpp)

// ---- an independent reference forward in double precision ----------------------------------

// Llama forward (Touvron et al. 2023) written directly with ATen in fp64 from
// the GGUF tensors: embedding, per layer RMSNorm -> GQA attention with RoPE on
// adjacent pairs -> residual -> RMSNorm -> SwiGLU -> residual, final norm, LM
// head. Returns logits [T, V].
at::Tensor reference_logits(const std::string& path, const std::vector<TokenId>& toks) {
  dspark::io::GGUFFile f(path);
  auto W = [&](const std::string& name) {
    return dspark::io::dequantize_tensor(f.tensor(name), at::kFloat).to(at::kDouble);
  };
  auto Wb = [&](const std::string& name) {  // matrices as the model holds them: bf16
    return dspark::io::dequantize_tensor(f.tensor(name), at::kBFloat16).to(at::kDouble);
  };
  const int64_t nl = f.get_int("llama.block_count"), H = f.get_int("llama.attention.head_count"),
                Hkv = f.get_int("llama.attention.head_count_kv"), d = f.get_int("llama.embedding_length");
  const int64_t hd = d / H, T = static_cast<int64_t>(toks.size());
  const double eps = f.get_float("llama.attention.layer_norm_rms_epsilon");
  const double base = f.get_float("llama.rope.freq_base");
  auto rms = [&](const at::Tensor& x, const at::Tensor& w) {
    return x * at::rsqrt(x.pow(2).mean({-1}, true) + eps) * w;
  };
  // RoPE on pairs (2i, 2i+1) of each head.
  const at::Tensor pos = at::arange(T, at::kDouble).view({T, 1});
  const at::Tensor inv = at::pow(base, -2.0 * at::arange(hd / 2, at::kDouble) / static_cast<double>(hd));
  const at::Tensor ang = pos * inv.view({1, hd / 2});  // [T, hd/2]
  const at::Tensor cs = at::cos(ang).view({T, 1, hd / 2}), sn = at::sin(ang).view({T, 1, hd / 2});
  auto rope = [&](const at::Tensor& x, int64_t nh) {  // x: [T, nh*hd]
    const at::Tensor v = x.view({T, nh, hd / 2, 2});
    const at::Tensor a = v.select(3, 0), b = v.select(3, 1);
    return at::stack({a * cs - b * sn, a * sn + b * cs}, 3).reshape({T, nh * hd});
  };
  const at::Tensor ids = at::tensor(std::vector<int64_t>(toks.begin(), toks.end()), at::kLong);
  at::Tensor x = Wb("token_embd.weight").index_select(0, ids);
  const at::Tensor mask = at::ones({T, T}, at::kBool).triu(1);
  for (int64_t l = 0; l < nl; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const at::Tensor h = rms(x, W(p + "attn_norm.weight"));
    const at::Tensor q = rope(at::matmul(h, Wb(p + "attn_q.weight").t()), H).view({T, H, hd}).transpose(0, 1);
    const at::Tensor k = rope(at::matmul(h, Wb(p + "attn_k.weight").t()), Hkv)
                             .view({T, Hkv, hd})
                             .transpose(0, 1)
                             .repeat_interleave(H / Hkv, 0);
    const at::Tensor v =
        at::matmul(h, Wb(p + "attn_v.weight").t()).view({T, Hkv, hd}).transpose(0, 1).repeat_interleave(H / Hkv, 0);
    at::Tensor s = at::matmul(q, k.transpose(1, 2)) / std::sqrt(static_cast<double>(hd));
    s = s.masked_fill(mask, -INFINITY);
    const at::Tensor o = at::matmul(at::softmax(s, -1), v).transpose(0, 1).reshape({T, H * hd});
    x = x + at::matmul(o, Wb(p + "attn_output.weight").t());
    const at::Tensor h2 = rms(x, W(p + "ffn_norm.weight"));
    const at::Tensor g = at::matmul(h2, Wb(p + "ffn_gate.weight").t());
    const at::Tensor u = at::matmul(h2, Wb(p + "ffn_up.weight").t());
    x = x + at::matmul(g * at::sigmoid(g) * u, Wb(p + "ffn_down.weight").t());
  }
  const at::Tensor head = f.find_tensor("output.weight") ? Wb("output.weight") : Wb("token_embd.weight");
  return at::matmul(rms(x, W("output_norm.weight")), head.t());
}

// ---- tiny random Llama ----------------------------------------------------------------------

class LlamaTiny : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    path_ = dir_->file("tiny.gguf");
    dspark::test::write_tiny_llama(path_, 42);
    model_ = dspark::load_target(path_).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
    delete dir_;
    dir_ = nullptr;
  }
  static TargetModel& m() { return *model_; }
  static std::vector<TokenId> tokens(size_t n, uint32_t seed) {
    std::vector<TokenId> t(n);
    for (size_t i = 0; i < n; ++i) t[i] = static_cast<TokenId>((seed * 2654435761u + i * 40503u) % dspark::test::kTinyVocab);
    return t;
  }

  static inline TempDir* dir_ = nullptr;
  static inline std::string path_;
  static inline TargetModel* model_ = nullptr;
};

TEST_F(LlamaTiny, InfoFromMetadata) {
  const auto& i = m().info();
  EXPECT_EQ(i.arch, "llama");
  EXPECT_EQ(i.id, "llama/tiny-llama-42");
  EXPECT_EQ(i.path, path_);
  EXPECT_EQ(i.n_layers, 2);
  EXPECT_EQ(i.hidden, 64);
  EXPECT_EQ(i.n_heads, 4);
  EXPECT_EQ(i.n_kv_heads, 2);
  EXPECT_EQ(i.head_dim, 16);
  EXPECT_EQ(i.ffn, 128);
  EXPECT_EQ(i.vocab, dspark::test::kTinyVocab);
  EXPECT_EQ(i.context, 256);
  EXPECT_NEAR(i.rms_eps, 1e-5, 1e-10);
  EXPECT_EQ(i.rope_base, 10000.0);
  EXPECT_EQ(m().embedding().sizes(), (at::IntArrayRef{dspark::test::kTinyVocab, 64}));
  EXPECT_EQ(m().embedding().scalar_type(), at::kBFloat16);
  EXPECT_EQ(m().lm_head().sizes(), (at::IntArrayRef{dspark::test::kTinyVocab, 64}));
  EXPECT_NE(m().lm_head().data_ptr(), m().embedding().data_ptr());
  EXPECT_EQ(m().output_norm().sizes(), (at::IntArrayRef{64}));
  EXPECT_EQ(m().output_norm().scalar_type(), at::kFloat);
  const KVCache c = m().new_cache();
  EXPECT_EQ(c.max_tokens(), 256);
  EXPECT_EQ(c.size(), 0);
  EXPECT_EQ(m().new_cache(17).max_tokens(), 17);
}

TEST_F(LlamaTiny, MatchesDoubleReference) {
  const auto toks = tokens(12, 1);
  KVCache c = m().new_cache();
  dspark::test::expect_close_to_reference(m().forward_one(c, toks, Logits::All).logits, reference_logits(path_, toks));
}

// Every quantized weight type, computed on its blocks (--compute quant): the
// same bitwise properties as the bf16 model — a sequence alone equals it
// inside ragged batches of several lengths, prefill equals incremental
// decoding, and a trimmed cache equals a fresh one. Hidden size 256 so the
// 256-element K-quant super-blocks fit a row; the matrices hold random codes.
class LlamaTinyQuant : public ::testing::TestWithParam<dspark::io::GGMLType> {};

TEST_P(LlamaTinyQuant, BatchInvariantAndLosslessProperties) {
  TempDir dir;
  dspark::test::TinyLlamaOptions o;
  o.hidden = 256;
  o.n_heads = 4;
  o.n_kv_heads = 2;
  o.ffn = 512;
  o.weight_type = GetParam();
  const std::string path = dir.file("tiny-q.gguf");
  dspark::test::write_tiny_llama(path, 5, o);
  auto m = dspark::load_target(path, dspark::ops::Compute::Quant);
  EXPECT_EQ(m->info().compute, "quant");
  EXPECT_TRUE(m->head().quantized());
  auto toks = [](size_t n, uint32_t seed) {
    std::vector<TokenId> t(n);
    for (size_t i = 0; i < n; ++i) t[i] = static_cast<TokenId>((seed * 2654435761u + i * 40503u) % dspark::test::kTinyVocab);
    return t;
  };
  check_prefill_equals_incremental(*m, toks(20, 2));
  check_trim_then_reforward(*m, toks(7, 3), toks(9, 4), toks(4, 5));
  check_batch_equals_alone(*m, {toks(3, 10), {}, toks(6, 11), toks(1, 12)},
                           {toks(5, 13), toks(1, 14), toks(33, 15), toks(8, 16)}, TapRequest{{1}, true});
  // The dequantized bf16 path of the same file agrees to quantization noise.
  auto b = dspark::load_target(path, dspark::ops::Compute::BF16);
  KVCache cq = m->new_cache(), cb = b->new_cache();
  const auto t = toks(12, 7);
  const at::Tensor lq = m->forward_one(cq, t, Logits::All).logits, lb = b->forward_one(cb, t, Logits::All).logits;
  const double err = (lq - lb).abs().max().item<double>(), scale = lb.abs().max().item<double>();
  EXPECT_LT(err, 0.1 * scale) << "max |diff| " << err << " for logits up to " << scale;
}

INSTANTIATE_TEST_SUITE_P(Types, LlamaTinyQuant,
                         ::testing::Values(dspark::io::GGMLType::Q8_0, dspark::io::GGMLType::Q4_0,
                                           dspark::io::GGMLType::Q4_1, dspark::io::GGMLType::Q5_0,
                                           dspark::io::GGMLType::Q4_K, dspark::io::GGMLType::Q6_K),
                         [](const auto& i) { return dspark::io::ggml_type_name(static_cast<uint32_t>(i.param)); });

TEST_F(LlamaTiny, RepeatedTapLayerIsCapturedTwice) {
  const auto toks = tokens(4, 40);
  KVCache c1 = m().new_cache(), c2 = m().new_cache();
  const ForwardOut one = m().forward_one(c1, toks, Logits::None, TapRequest{{1}, false});
  try {
    const ForwardOut two = m().forward_one(c2, toks, Logits::None, TapRequest{{1, 1}, false});
    ASSERT_EQ(two.taps.sizes(), (at::IntArrayRef{4, 128}));
    EXPECT_TRUE(same_bits(two.taps.narrow(1, 0, 64), one.taps)) << "first copy";
    EXPECT_TRUE(same_bits(two.taps.narrow(1, 64, 64), one.taps)) << "second copy";
  } catch (const InvalidArgument&) {
    EXPECT_EQ(c2.size(), 0);  // rejecting duplicates is acceptable too
  }
}

TEST_F(LlamaTiny, EmptySequenceInBatchGetsNoLogits) {
  KVCache a = m().new_cache(), b = m().new_cache();
  const auto toks = tokens(3, 50);
  std::vector<ForwardSeq> batch = {{&a, toks, Logits::Last}, {&b, {}, Logits::Last}};
  try {
    const auto outs = m().forward(batch);
    ASSERT_EQ(outs.size(), 2u);
    EXPECT_EQ(a.size(), 3);
    EXPECT_EQ(b.size(), 0);
    EXPECT_EQ(outs[0].logits.sizes(), (at::IntArrayRef{1, m().info().vocab}));
    EXPECT_FALSE(outs[1].logits.defined()) << "a sequence without tokens has no last position";
  } catch (const InvalidArgument&) {
    EXPECT_EQ(a.size(), 0);  // rejecting an empty sequence is acceptable too
    EXPECT_EQ(b.size(), 0);
  }
}

// The same random weights stored as F32 and as BF16 load to identical bf16
// matrices, so the logits agree bitwise; F16, Q8_0 and tied embeddings load
// and give finite logits close to them.
TEST_F(LlamaTiny, WeightEncodings) {
  TempDir dir;
  const auto toks = tokens(5, 60);
  auto run = [&](const TinyLlamaOptions& o, const std::string& name) {
    const std::string path = dir.file(name);
    dspark::test::write_tiny_llama(path, 42, o);
    auto model = dspark::load_target(path);
    KVCache c = model->new_cache();
    return model->forward_one(c, toks, Logits::All).logits.clone();
  };
  KVCache c = m().new_cache();
  const at::Tensor bf16 = m().forward_one(c, toks, Logits::All).logits;
  TinyLlamaOptions o;
  o.weight_type = dspark::io::GGMLType::F32;
  EXPECT_TRUE(same_bits(run(o, "f32.gguf"), bf16)) << "F32 file";
  o.version = 2;
  EXPECT_TRUE(same_bits(run(o, "f32v2.gguf"), bf16)) << "GGUF v2 file";
  o = TinyLlamaOptions{};
  o.weight_type = dspark::io::GGMLType::F16;
  const at::Tensor f16 = run(o, "f16.gguf");
  EXPECT_LT((f16 - bf16).abs().max().item<double>(), 0.05 * bf16.abs().max().item<double>());
  o.weight_type = dspark::io::GGMLType::Q8_0;
  const at::Tensor q8 = run(o, "q8.gguf");
  EXPECT_TRUE(at::isfinite(q8).all().item<bool>());
  EXPECT_LT((q8 - bf16).abs().max().item<double>(), 0.1 * bf16.abs().max().item<double>());

  o = TinyLlamaOptions{};
  o.tied_embeddings = true;
  const std::string tied = dir.file("tied.gguf");
  dspark::test::write_tiny_llama(tied, 7, o);
  auto model = dspark::load_target(tied);
  EXPECT_EQ(model->lm_head().data_ptr(), model->embedding().data_ptr());
  KVCache ct = model->new_cache();
  const at::Tensor lt = model->forward_one(ct, toks, Logits::All).logits.to(at::kDouble);
  const at::Tensor ref = reference_logits(tied, toks);
  EXPECT_LT((lt - ref).abs().max().item<double>(), 0.02 * ref.abs().max().item<double>());
}

TEST_F(LlamaTiny, UnsupportedArchitectureIsFormatError) {
  TempDir dir;
  auto w = dspark::test::tiny_llama_writer(1);
  w.set("general.architecture", dspark::io::gguf::string("mamba"));
  const std::string path = dir.file("mamba.gguf");
  w.write(path);
  try {
    dspark::load_target(path);
    FAIL() << "mamba accepted";
  } catch (const FormatError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("unsupported architecture 'mamba'"), std::string::npos) << msg;
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
  }
}

TEST_F(LlamaTiny, UnsupportedTensorTypeNamesTheTensor) {
  TempDir dir;
  TinyLlamaOptions o;
  o.ffn = 256;  // ffn_down rows hold 256 values: one Q5_K super-block
  o.tensor_types["blk.1.ffn_down.weight"] = dspark::io::GGMLType::Q5_K;
  const std::string path = dir.file("q5k.gguf");
  dspark::test::write_tiny_llama(path, 3, o);
  {
    dspark::io::GGUFFile f(path);  // the container itself is valid
    EXPECT_EQ(f.tensor("blk.1.ffn_down.weight").type(), dspark::io::GGMLType::Q5_K);
  }
  try {
    dspark::load_target(path);
    FAIL() << "Q5_K tensor accepted";
  } catch (const FormatError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("blk.1.ffn_down.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("Q5_K"), std::string::npos) << msg;
  }
}

TEST_F(LlamaTiny, InconsistentShapesAreFormatErrors) {
  TempDir dir;
  // Metadata claiming a wider model than the tensors hold.
  auto w = dspark::test::tiny_llama_writer(5);
  w.set("llama.feed_forward_length", dspark::io::gguf::u32(96));
  w.write(dir.file("ffn.gguf"));
  try {
    dspark::load_target(dir.file("ffn.gguf"));
    FAIL() << "mismatched ffn accepted";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("ffn_gate.weight"), std::string::npos) << e.what();
  }
  // A missing tensor.
  auto w2 = dspark::test::tiny_llama_writer(5);
  w2.set("llama.block_count", dspark::io::gguf::u32(3));
  w2.write(dir.file("layers.gguf"));
  try {
    dspark::load_target(dir.file("layers.gguf"));
    FAIL() << "missing layer accepted";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("blk.2."), std::string::npos) << e.what();
  }
}

// ---- the real SmolLM2 model ------------------------------------------------------------------

class LlamaSmol : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (dspark::test::model_available()) model_ = dspark::load_target(dspark::test::model_path()).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  void SetUp() override {
    if (!model_) GTEST_FAIL() << dspark::test::missing_model_message();
  }
  static TargetModel& m() { return *model_; }

  // "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
  static inline const std::vector<TokenId> kPrompt = {1, 4093, 198, 1780, 314, 260, 3575, 282,
                                                      4649, 47, 2, 198, 1, 520, 9531, 198};
  static inline TargetModel* model_ = nullptr;
};

TEST_F(LlamaSmol, Info) {
  const auto& i = m().info();
  EXPECT_EQ(i.arch, "llama");
  EXPECT_EQ(i.n_layers, 30);
  EXPECT_EQ(i.hidden, 576);
  EXPECT_EQ(i.n_heads, 9);
  EXPECT_EQ(i.n_kv_heads, 3);
  EXPECT_EQ(i.head_dim, 64);
  EXPECT_EQ(i.ffn, 1536);
  EXPECT_EQ(i.vocab, 49152);
  EXPECT_EQ(i.context, 8192);
  EXPECT_EQ(i.rope_base, 100000.0);
  EXPECT_EQ(m().lm_head().data_ptr(), m().embedding().data_ptr()) << "SmolLM2 ties its LM head";
}

TEST_F(LlamaSmol, GreedyAnswersParis) {
  dspark::io::GGUFFile f(dspark::test::model_path());
  const auto vocab = f.get_string_array("tokenizer.ggml.tokens");
  auto id_of = [&](const std::string& tok) -> TokenId {
    const auto it = std::find(vocab.begin(), vocab.end(), tok);
    EXPECT_NE(it, vocab.end()) << tok;
    return static_cast<TokenId>(it - vocab.begin());
  };
  const std::string sp = "\xC4\xA0";  // 'Ġ': the GPT-2 symbol of the space byte
  const std::vector<TokenId> want = {id_of("The"), id_of(sp + "capital"), id_of(sp + "of"),
                                     id_of(sp + "France"), id_of(sp + "is"), id_of(sp + "Paris")};
  KVCache c = m().new_cache();
  at::Tensor logits = m().forward_one(c, kPrompt, Logits::Last).logits;
  std::vector<TokenId> got;
  for (size_t i = 0; i < want.size(); ++i) {
    const TokenId next = static_cast<TokenId>(logits[0].argmax().item<int64_t>());
    got.push_back(next);
    logits = m().forward_one(c, std::span<const TokenId>(&next, 1), Logits::Last).logits;
  }
  EXPECT_EQ(got, want);
  EXPECT_EQ(c.size(), static_cast<int64_t>(kPrompt.size() + want.size()));
}

TEST_F(LlamaSmol, PrefillEqualsIncremental) { check_prefill_equals_incremental(m(), slice(kPrompt, 0, 12)); }

TEST_F(LlamaSmol, TrimThenReforwardEqualsFreshPrefill) {
  check_trim_then_reforward(m(), slice(kPrompt, 0, 10), {3575, 282, 4649, 47}, {906, 30, 9531});
}

TEST_F(LlamaSmol, BatchEqualsEachAlone) {
  check_batch_equals_alone(m(), {slice(kPrompt, 0, 4), {}, slice(kPrompt, 0, 9)},
                           {slice(kPrompt, 4, 9), {1}, slice(kPrompt, 9, 16)}, TapRequest{{1, 5, 28}, true});
}

TEST_F(LlamaSmol, HiddenTaps) { check_taps(m(), slice(kPrompt, 0, 8), {1, 5, 28}); }

TEST_F(LlamaSmol, ErrorsLeaveCachesUnchanged) { check_errors(m()); }

}  // namespace

namespace {

// Nonsense hyper-parameters in the GGUF metadata are refused with the key
// named, before anything divides by them or sizes an allocation from them.
TEST(LlamaLoad, RefusesNonsenseHyperParameters) {
  namespace g = dspark::io::gguf;
  struct Case {
    const char* key;
    dspark::io::GGUFValue value;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"llama.attention.head_count", g::u32(0), "llama.attention.head_count"},
      {"llama.block_count", g::u32(1u << 31), "inconsistent llama hyper-parameters"},
      {"llama.rope.dimension_count", g::u32(0), "rope dims 0"},
      {"llama.context_length", g::u32(0), "llama.context_length"},
      {"llama.rope.freq_base", g::f32(0.f), "llama.rope.freq_base"},
      {"llama.rope.freq_base", g::f32(std::nanf("")), "llama.rope.freq_base"},
      {"llama.attention.layer_norm_rms_epsilon", g::f32(-1.f), "llama.attention.layer_norm_rms_epsilon"},
      {"llama.vocab_size", g::u32(7), "llama.vocab_size is 7"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.key);
    TempDir tmp;
    auto w = dspark::test::tiny_llama_writer(3);
    w.set(c.key, c.value);
    const std::string path = tmp.file("bad.gguf");
    w.write(path);
    try {
      dspark::load_target(path);
      ADD_FAILURE() << "loaded";
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(c.expect), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
  }
}

}  // namespace
