// A drafter written by an independent implementation: DeepSpec's modeling
// code (scripts/golden/make_deepspec_golden.py, DeepSpec pinned there) built
// three small random drafters (vanilla Markov, gated Markov, RNN head), saved
// them in its Hugging Face layout and recorded one drafting pass. Imported
// with `import_drafter(..., HF)` and run by dspark's drafter against a tiny
// target whose embedding and LM head are the drafter's embed_tokens and
// lm_head, they reproduce DeepSpec's block hidden states, base logits,
// head-biased logits and confidence logits within bf16 tolerance, and the
// same greedy draft wherever DeepSpec's top-2 margin exceeds that tolerance.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "dspark/io/safetensors.hpp"
#include "dspark/model/target.hpp"
#include "dspark/speculative/interop.hpp"
#include "spec_test_util.hpp"

namespace {

using namespace dspark;

const std::string kGolden = DSPARK_SOURCE_DIR "/tests/golden/deepspec/";

// A tiny Llama GGUF (2 layers, d = 64) whose token_embd and output are the
// drafter's embed_tokens and lm_head (bf16, so the target holds them exactly).
std::unique_ptr<TargetModel> target_for(const io::SafetensorsData& weights, const test::TempDir& dir) {
  test::TinyLlamaOptions o;
  o.n_layers = 2;
  o.hidden = 64;
  o.n_heads = 4;
  o.n_kv_heads = 2;
  o.ffn = 128;
  const io::GGUFWriter base = test::tiny_llama_writer(5, o);
  const std::string tmp = dir.file("base.gguf"), path = dir.file("target.gguf");
  base.write(tmp);
  io::GGUFFile f(tmp);
  io::GGUFWriter w;
  for (const auto& [k, v] : f.metadata())
    if (k != "general.alignment") w.set(k, v);
  for (const auto& ti : f.tensors())
    if (ti.name != "token_embd.weight" && ti.name != "output.weight")
      w.add_tensor(ti.name, ti.type_id, ti.ne, std::string_view(reinterpret_cast<const char*>(ti.data), ti.n_bytes));
  w.add_tensor("token_embd.weight", weights.tensors.at("embed_tokens.weight"));
  w.add_tensor("output.weight", weights.tensors.at("lm_head.weight"));
  w.write(path);
  return load_target(path);
}

float max_abs(const at::Tensor& t) { return t.abs().max().item<float>(); }

// The sequential head's bias at slot k from the imported parameters, as
// DeepSpec defines it (markov_head.py): vanilla W2·e, gated W2·(σ(G[h;e]+b)⊙e),
// rnn W2·tanh(o) with the GRU-like state s carried across slots.
at::Tensor head_bias(const Drafter& d, const at::Tensor& h, TokenId prev, at::Tensor& s) {
  const auto& p = d.params();
  const at::Tensor e = p.at("markov_w1.weight")[prev];
  const at::Tensor& W2 = p.at("markov_w2.weight");
  switch (d.config().seq_head) {
    case SeqHead::Gated: {
      const at::Tensor g = at::sigmoid(at::matmul(p.at("markov_gate.weight"), at::cat({h, e})) + p.at("markov_gate.bias"));
      return at::matmul(W2, g * e);
    }
    case SeqHead::Rnn: {
      const auto gco = (at::matmul(p.at("rnn.weight"), at::cat({s, e, h})) + p.at("rnn.bias")).chunk(3);
      const at::Tensor g = at::sigmoid(gco[0]);
      s = g * s + (1 - g) * at::tanh(gco[1]);
      return at::matmul(W2, at::tanh(gco[2]));
    }
    default: return at::matmul(W2, e);
  }
}

class DeepSpecGolden : public testing::TestWithParam<std::string> {};

TEST_P(DeepSpecGolden, ImportedDrafterReproducesDeepSpecsBlockLogits) {
  const std::string dir_hf = kGolden + GetParam();
  const io::SafetensorsData gold = io::load_safetensors(dir_hf + "/golden.safetensors");
  const io::SafetensorsData weights = io::load_safetensors(dir_hf + "/model.safetensors");
  test::TempDir tmp;
  const auto target = target_for(weights, tmp);
  InteropNotes notes;
  Drafter d = import_drafter(dir_hf, target->info(), DrafterFormat::HF, &notes);
  const SeqHead want = GetParam() == "gated" ? SeqHead::Gated : GetParam() == "rnn" ? SeqHead::Rnn : SeqHead::Markov;
  ASSERT_EQ(d.config().seq_head, want);
  EXPECT_EQ(d.config().gamma, 5);
  EXPECT_EQ(d.config().tap_layers, (std::vector<int>{0, 1}));
  EXPECT_EQ(d.config().mask_token_id, -1);  // DeepSpec's embed_tokens row 261 is the learned mask now
  EXPECT_EQ(d.config().eps, 1e-6);
  d.bind(*target);

  DraftState st;
  d.append_context(st, gold.tensors.at("context"));
  const TokenId anchor = static_cast<TokenId>(gold.tensors.at("anchor")[0].item<int64_t>());
  const at::Tensor h = d.block_hidden(st, anchor, 5);
  const at::Tensor gh = gold.tensors.at("block_hidden");
  // bf16 tolerance: the kernels round matmul inputs to bf16 (relative 2^-8 per
  // operand) through two layers; the errors seen are about a third of this.
  EXPECT_LE(max_abs(h - gh), 0.01f * (1.f + max_abs(gh))) << "block hidden";

  std::vector<float> U(static_cast<size_t>(5 * 262));
  target->head().forward(h.data_ptr<float>(), 5, U.data(), 262);
  const at::Tensor base = at::from_blob(U.data(), {5, 262}, at::kFloat).clone();
  const at::Tensor gbase = gold.tensors.at("base_logits"), glogits = gold.tensors.at("logits");
  const float tol = 0.01f * (1.f + max_abs(glogits));
  EXPECT_LE(max_abs(base - gbase), tol) << "base logits";

  // Biased logits along DeepSpec's greedy path.
  const at::Tensor gtok = gold.tensors.at("tokens");
  at::Tensor s = at::zeros({32});
  TokenId prev = anchor;
  for (int k = 0; k < 5; ++k) {
    const at::Tensor logits = base[k] + head_bias(d, h[k], prev, s);
    EXPECT_LE(max_abs(logits - glogits[k]), tol) << "logits, slot " << k;
    prev = static_cast<TokenId>(gtok[k].item<int64_t>());
  }

  // dspark's own drafting pass: the greedy draft and confidence logits.
  SamplingParams greedy;
  greedy.temperature = 0.f;
  Rng rng(1);
  const Draft dr = d.draft(st, anchor, 5, greedy, rng);
  const at::Tensor gconf = gold.tensors.at("conf_logits");
  int compared = 0;
  for (int k = 0; k < 5; ++k) {
    const auto top2 = std::get<0>(glogits[k].topk(2));
    if ((top2[0] - top2[1]).item<float>() < 2 * tol) break;  // a near-tie: later slots depend on it
    EXPECT_EQ(dr.tokens[static_cast<size_t>(k)], gtok[k].item<int64_t>()) << "slot " << k;
    EXPECT_NEAR(dr.conf_logits[static_cast<size_t>(k)], gconf[k].item<float>(), 0.01f * (1.f + std::fabs(gconf[k].item<float>())))
        << "confidence, slot " << k;
    ++compared;
  }
  EXPECT_GE(compared, 2) << "the golden's margins leave too few slots to compare";
}

INSTANTIATE_TEST_SUITE_P(Heads, DeepSpecGolden, testing::Values("vanilla", "gated", "rnn"),
                         [](const auto& i) { return i.param; });

}  // namespace
