// Tests for the Gemma 3 target: metadata (sliding-window pattern, key length,
// embedding scale, softcap), the forward pass against an independent ATen
// reference in double precision on a tiny random model (prompts longer than
// the sliding window), tensor-registry errors, and the real Gemma 3 270M's
// geometry and bitwise properties. Parity with llama.cpp on the real model is
// gemma3_parity_test.cpp's.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "dspark/error.hpp"
#include "dspark/io/dequant.hpp"
#include "dspark/io/gguf.hpp"
#include "dspark/model/target.hpp"
#include "target_checks.hpp"
#include "test_util.hpp"

namespace {

using dspark::FormatError;
using namespace dspark::test;  // TargetModel, KVCache, Logits, ... (target_checks.hpp)
namespace g = dspark::io::gguf;

// Gemma 3 forward written directly with ATen in fp64 from the GGUF tensors
// (HF transformers Gemma3ForCausalLM): embedding × sqrt(d); per layer
// RMSNorm (weights stored as 1 + w) -> q, k, v -> per-head RMSNorm of q and k
// -> RoPE on head halves (local base 10,000 on sliding layers, the global
// base otherwise) -> causal attention, masked to the last `window` positions
// on sliding layers, scale 1/sqrt(key_length) -> output -> post-attention
// RMSNorm -> residual; RMSNorm -> GELU-tanh(gate) · up -> down -> post-FFN
// RMSNorm -> residual; final RMSNorm; tied LM head. Returns logits [T, V].
at::Tensor reference_logits(const std::string& path, const std::vector<TokenId>& toks) {
  dspark::io::GGUFFile f(path);
  auto W = [&](const std::string& name) {
    return dspark::io::dequantize_tensor(f.tensor(name), at::kFloat).to(at::kDouble);
  };
  auto Wb = [&](const std::string& name) {  // matrices as the bf16 model holds them
    return dspark::io::dequantize_tensor(f.tensor(name), at::kBFloat16).to(at::kDouble);
  };
  const int64_t nl = f.get_int("gemma3.block_count"), H = f.get_int("gemma3.attention.head_count"),
                Hkv = f.get_int("gemma3.attention.head_count_kv"), d = f.get_int("gemma3.embedding_length"),
                hd = f.get_int("gemma3.attention.key_length"), window = f.get_int("gemma3.attention.sliding_window"),
                period = f.get_int("gemma3.attention.sliding_window_pattern");
  const int64_t T = static_cast<int64_t>(toks.size());
  const double eps = f.get_float("gemma3.attention.layer_norm_rms_epsilon");
  auto rms = [&](const at::Tensor& x, const at::Tensor& w) { return x * at::rsqrt(x.pow(2).mean({-1}, true) + eps) * w; };
  const at::Tensor pos = at::arange(T, at::kDouble).view({T, 1});
  auto rope = [&](const at::Tensor& x, double base) {  // x: [T, nh, hd], halves rotate
    const at::Tensor inv = at::pow(base, -2.0 * at::arange(hd / 2, at::kDouble) / static_cast<double>(hd));
    const at::Tensor ang = (pos * inv.view({1, hd / 2})).unsqueeze(1);  // [T, 1, hd/2]
    const at::Tensor a = x.narrow(2, 0, hd / 2), b = x.narrow(2, hd / 2, hd / 2);
    return at::cat({a * at::cos(ang) - b * at::sin(ang), a * at::sin(ang) + b * at::cos(ang)}, 2);
  };
  const at::Tensor ids = at::tensor(std::vector<int64_t>(toks.begin(), toks.end()), at::kLong);
  at::Tensor x = Wb("token_embd.weight").index_select(0, ids) * static_cast<double>(std::sqrt(static_cast<float>(d)));
  const at::Tensor i = at::arange(T).view({T, 1}), j = at::arange(T).view({1, T});
  const at::Tensor causal = j > i, sliding = (j > i).logical_or(j <= i - window);
  for (int64_t l = 0; l < nl; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const bool local = l % period < period - 1;
    const double base = local ? 10000.0 : f.get_float("gemma3.rope.freq_base");
    const at::Tensor h = rms(x, W(p + "attn_norm.weight"));
    at::Tensor q = rms(at::matmul(h, Wb(p + "attn_q.weight").t()).view({T, H, hd}), W(p + "attn_q_norm.weight"));
    at::Tensor k = rms(at::matmul(h, Wb(p + "attn_k.weight").t()).view({T, Hkv, hd}), W(p + "attn_k_norm.weight"));
    q = rope(q, base).transpose(0, 1);
    k = rope(k, base).transpose(0, 1).repeat_interleave(H / Hkv, 0);
    const at::Tensor v =
        at::matmul(h, Wb(p + "attn_v.weight").t()).view({T, Hkv, hd}).transpose(0, 1).repeat_interleave(H / Hkv, 0);
    at::Tensor s = at::matmul(q, k.transpose(1, 2)) / std::sqrt(static_cast<double>(hd));
    s = s.masked_fill(local ? sliding : causal, -INFINITY);
    const at::Tensor o = at::matmul(at::softmax(s, -1), v).transpose(0, 1).reshape({T, H * hd});
    x = x + rms(at::matmul(o, Wb(p + "attn_output.weight").t()), W(p + "post_attention_norm.weight"));
    const at::Tensor h2 = rms(x, W(p + "ffn_norm.weight"));
    const at::Tensor gt = at::matmul(h2, Wb(p + "ffn_gate.weight").t());
    const at::Tensor up = at::matmul(h2, Wb(p + "ffn_up.weight").t());
    const at::Tensor act = 0.5 * gt * (1 + at::tanh(std::sqrt(2.0 / M_PI) * (gt + 0.044715 * gt.pow(3)))) * up;
    x = x + rms(at::matmul(act, Wb(p + "ffn_down.weight").t()), W(p + "post_ffw_norm.weight"));
  }
  return at::matmul(rms(x, W("output_norm.weight")), Wb("token_embd.weight").t());
}

std::vector<TokenId> tokens(size_t n, uint32_t seed, int64_t vocab) {
  std::vector<TokenId> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<TokenId>((seed * 2654435761u + i * 40503u) % vocab);
  return t;
}

std::string load_error(const dspark::io::GGUFWriter& w, const std::string& name) {
  TempDir dir;
  const std::string path = dir.file(name);
  w.write(path);
  try {
    dspark::load_target(path);
  } catch (const FormatError& e) {
    return e.what();
  }
  return "(loaded)";
}

TEST(Gemma3Tiny, InfoFromMetadata) {
  TempDir dir;
  const std::string path = dir.file("g.gguf");
  write_tiny_gemma(path, 42);
  auto m = dspark::load_target(path);
  const auto& i = m->info();
  EXPECT_EQ(i.arch, "gemma3");
  EXPECT_EQ(i.id, "gemma3/tiny-gemma-42");
  EXPECT_EQ(i.n_layers, 6);
  EXPECT_EQ(i.hidden, 64);
  EXPECT_EQ(i.n_heads, 2);
  EXPECT_EQ(i.n_kv_heads, 1);
  EXPECT_EQ(i.head_dim, 48) << "from attention.key_length, not hidden / heads";
  EXPECT_EQ(i.vocab, tiny_spm_vocab_size());
  EXPECT_EQ(i.rope_base, 1e6);
  EXPECT_EQ(i.embed_scale, 8.0);
  EXPECT_EQ(i.logit_softcap, 0.0);
  EXPECT_EQ(i.layer_window, (std::vector<int64_t>{8, 8, 0, 8, 8, 0}));
  EXPECT_EQ(&m->head(), &m->embedding_table()) << "Gemma ties its LM head";
  EXPECT_NE(m->lm_head().data_ptr(), m->embedding().data_ptr()) << "embedding() is scaled, the head is not";
  EXPECT_TRUE(at::allclose(m->embedding().to(at::kFloat), m->lm_head().to(at::kFloat) * 8.0, 0.01, 1e-6));
  const KVCache c = m->new_cache();
  EXPECT_EQ(c.window(0), 8);
  EXPECT_EQ(c.window(2), 0);
}

TEST(Gemma3Tiny, MatchesDoubleReferencePastTheWindow) {
  TempDir dir;
  const std::string path = dir.file("g.gguf");
  write_tiny_gemma(path, 5);
  auto m = dspark::load_target(path, dspark::ops::Compute::BF16);
  const auto toks = tokens(29, 1, m->info().vocab);  // window 8: most positions see a truncated past
  KVCache c = m->new_cache();
  const at::Tensor got = m->forward_one(c, toks, Logits::All).logits;
  const at::Tensor ref = reference_logits(path, toks);
  expect_close_to_reference(got, ref);
  const double err = (got.to(at::kDouble) - ref).abs().max().item<double>();
  // A wrong window would show here: without the mask the reference moves by far more.
  TinyGemmaOptions wide;
  wide.window = 64;
  const std::string wpath = dir.file("wide.gguf");
  write_tiny_gemma(wpath, 5, wide);
  EXPECT_GT((reference_logits(wpath, toks) - ref).abs().max().item<double>(), 10 * err);
}

TEST(Gemma3Tiny, SlidingWindowPatternAndAbsence) {
  auto windows = [](dspark::io::GGUFWriter w) {
    TempDir dir;
    const std::string path = dir.file("p.gguf");
    w.write(path);
    return dspark::load_target(path)->info().layer_window;
  };
  auto bools = [](std::vector<bool> v) {
    dspark::io::GGUFValue::Array a;
    for (bool b : v) a.push_back(g::boolean(b));
    return g::array(dspark::io::GGUFValueType::BOOL, std::move(a));
  };
  auto w = tiny_gemma_writer(1);
  w.set("gemma3.attention.sliding_window_pattern", bools({true, false, false, true, true, false}));
  EXPECT_EQ(windows(w), (std::vector<int64_t>{8, 0, 0, 8, 8, 0}));
  auto w2 = tiny_gemma_writer(1);
  w2.erase("gemma3.attention.sliding_window_pattern");  // default period 6: only the last layer is global
  EXPECT_EQ(windows(w2), (std::vector<int64_t>{8, 8, 8, 8, 8, 0}));
  auto w3 = tiny_gemma_writer(1);
  w3.erase("gemma3.attention.sliding_window");
  EXPECT_EQ(windows(w3), (std::vector<int64_t>(6, 0)));
  auto w4 = tiny_gemma_writer(1);
  w4.set("gemma3.attention.sliding_window_pattern", bools({true, false}));
  EXPECT_NE(load_error(w4, "bad.gguf").find("sliding_window_pattern has 2 entries for 6 layers"), std::string::npos);
}

TEST(Gemma3Tiny, FinalLogitSoftcap) {
  TempDir dir;
  TinyGemmaOptions o;
  o.softcap = 1.5f;
  const std::string path = dir.file("cap.gguf");
  write_tiny_gemma(path, 3, o);
  auto m = dspark::load_target(path);
  EXPECT_EQ(m->info().logit_softcap, 1.5);
  KVCache c = m->new_cache();
  const auto toks = tokens(6, 2, m->info().vocab);
  const auto out = m->forward_one(c, toks, Logits::All, TapRequest{{}, true});
  at::Tensor raw = at::empty({6, m->info().vocab}, at::kFloat);
  m->head().forward(out.final_hidden.data_ptr<float>(), 6, raw.data_ptr<float>(), m->info().vocab);
  EXPECT_GT(raw.abs().max().item<float>(), 1.5f) << "the cap must bind for this test to mean anything";
  EXPECT_TRUE(at::allclose(out.logits, 1.5 * at::tanh(raw / 1.5), 1e-6, 1e-6));
  EXPECT_LE(out.logits.abs().max().item<float>(), 1.5f);
}

TEST(Gemma3Tiny, RegistryNamesMissingOrMisshapenTensors) {
  TinyGemmaOptions o;
  o.skip_tensors = {"blk.4.post_ffw_norm.weight"};
  auto w = tiny_gemma_writer(1, o);
  const std::string e = load_error(w, "missing.gguf");
  EXPECT_NE(e.find("missing tensor 'blk.4.post_ffw_norm.weight'"), std::string::npos) << e;
  auto w2 = tiny_gemma_writer(1);
  w2.set("gemma3.attention.key_length", g::u32(32));
  const std::string e2 = load_error(w2, "keylen.gguf");
  EXPECT_NE(e2.find("blk.0.attn_q.weight"), std::string::npos) << e2;
  EXPECT_NE(e2.find("expected [64, 64]"), std::string::npos) << e2;
}

// ---- the real Gemma 3 270M -------------------------------------------------------------

class Gemma3Real : public ::testing::Test {
 protected:
  static TargetModel& m() {
    static std::unique_ptr<TargetModel> model = dspark::load_target(gemma_model_path());
    return *model;
  }
  void SetUp() override { DSPARK_REQUIRE_GEMMA(); }
};

TEST_F(Gemma3Real, Info) {
  const auto& i = m().info();
  EXPECT_EQ(i.arch, "gemma3");
  EXPECT_EQ(i.id, "gemma3/gemma-3-270M");
  EXPECT_EQ(i.n_layers, 18);
  EXPECT_EQ(i.hidden, 640);
  EXPECT_EQ(i.n_heads, 4);
  EXPECT_EQ(i.n_kv_heads, 1);
  EXPECT_EQ(i.head_dim, 256);
  EXPECT_EQ(i.ffn, 2048);
  EXPECT_EQ(i.vocab, 262144);
  EXPECT_EQ(i.context, 32768);
  EXPECT_EQ(i.rope_base, 1e6);
  EXPECT_NEAR(i.rms_eps, 1e-6, 1e-12);
  EXPECT_EQ(i.embed_scale, static_cast<double>(std::sqrt(640.f)));
  for (int64_t l = 0; l < 18; ++l) EXPECT_EQ(i.layer_window[l], l % 6 == 5 ? 0 : 512) << "layer " << l;
  EXPECT_EQ(m().head().type_name(), "Q8_0");
}

TEST_F(Gemma3Real, BitwiseProperties) {
  // Arbitrary valid ids, BOS first: the properties hold for any input.
  const std::vector<TokenId> p = {2, 818, 5279, 529, 7001, 563, 9079, 236761, 108, 651, 2864, 1546, 496};
  check_prefill_equals_incremental(m(), slice(p, 0, 9));
  check_trim_then_reforward(m(), slice(p, 0, 6), slice(p, 6, 10), slice(p, 10, 13));
  check_batch_equals_alone(m(), {slice(p, 0, 4), {}, slice(p, 0, 7)}, {slice(p, 4, 9), {2}, slice(p, 7, 13)},
                           TapRequest{{1, 8, 15}, true});
}

}  // namespace
