// Drafters in other projects' formats (dspark/speculative/interop.hpp): round trips
// dspark -> llama.cpp GGUF -> dspark and dspark -> DeepSpec HF -> dspark give
// bit-identical parameters, the same configuration and the same greedy
// drafts, for every head each format holds, learned and fixed-row masks, bf16
// and fp32 parameters, with and without a draft vocabulary; the GGUF holds
// what llama.cpp's dflash loader reads (metadata, tensor shapes and types, the
// NeoX row order of q/k); what a format cannot hold is refused with a message
// naming it. The shipped SmolLM2 drafter makes both round trips too.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "dspark/error.hpp"
#include "dspark/io/dequant.hpp"
#include "dspark/io/gguf.hpp"
#include "dspark/io/gguf_writer.hpp"
#include "dspark/io/safetensors.hpp"
#include "dspark/speculative/checkpoint.hpp"
#include "dspark/speculative/interop.hpp"
#include "spec_test_util.hpp"

namespace {

using namespace dspark;
namespace fs = std::filesystem;

constexpr int64_t kMaskRow = 2;  // the tiny vocabulary's control tokens are all declared special ids

// A perturbed drafter of the tiny target; `bf16` rounds every parameter to
// bf16 (as shipped), otherwise the fp32 values of a training checkpoint stay.
Drafter tiny_drafter(SeqHead head, int mask, bool bf16, std::vector<TokenId> draft_vocab = {}) {
  DrafterConfig c = spectest::small_config(spectest::tiny_target().info(), head, 5);
  c.mask_token_id = mask;
  c.draft_vocab = std::move(draft_vocab);
  c.sts_thresholds = {0.1, 0.2, 0.3, 0.4, 0.5};
  Drafter d = spectest::perturbed_drafter(c, 77);
  for (auto& [name, p] : d.mutable_params()) {
    if (head == SeqHead::None && name == "markov_w2.weight") p.zero_();
    if (bf16) p = p.to(at::kBFloat16).to(at::kFloat);
  }
  return d;
}

void expect_same_config(const DrafterConfig& a, const DrafterConfig& b) {
  EXPECT_EQ(config_to_json(a), config_to_json(b));
  EXPECT_EQ(a.target_id, b.target_id);
  EXPECT_EQ(a.hidden, b.hidden);
  EXPECT_EQ(a.vocab, b.vocab);
  EXPECT_EQ(a.eps, b.eps);
}

void expect_bit_identical(const Drafter& a, const Drafter& b) {
  ASSERT_EQ(a.params().size(), b.params().size());
  for (const auto& [name, p] : a.params()) {
    ASSERT_TRUE(b.params().count(name)) << name;
    const at::Tensor& q = b.params().at(name);
    ASSERT_EQ(p.sizes(), q.sizes()) << name;
    // Bitwise: the raw fp32 words, so -0.0 vs 0.0 or NaN payloads would show.
    EXPECT_TRUE(at::equal(p.view(at::kInt), q.view(at::kInt))) << name;
  }
}

std::string out_path(const test::TempDir& dir, DrafterFormat f) {
  return dir.file(f == DrafterFormat::GGUF ? "drafter.gguf" : "drafter-hf");
}

Drafter round_trip(const Drafter& d, DrafterFormat f, const test::TempDir& dir, InteropNotes* notes = nullptr) {
  const TargetInfo& t = spectest::tiny_target().info();
  ExportOptions opts;
  opts.mask_row = kMaskRow;
  export_drafter(d, t, f, out_path(dir, f), opts);
  EXPECT_EQ(detect_drafter_format(out_path(dir, f)), f);
  return import_drafter(out_path(dir, f), t, f, notes);
}

struct Case {
  DrafterFormat format;
  SeqHead head;
  int mask;
  bool bf16;
  bool draft_vocab;
};

std::string case_name(const testing::TestParamInfo<Case>& i) {
  const Case& c = i.param;
  return to_string(c.format) + "_" + to_string(c.head) + (c.mask < 0 ? "_learned" : "_row") +
         (c.bf16 ? "_bf16" : "_f32") + (c.draft_vocab ? "_dv" : "");
}

class RoundTrip : public testing::TestWithParam<Case> {};

TEST_P(RoundTrip, BitIdenticalParametersSameConfigSameGreedyDrafts) {
  const Case& k = GetParam();
  std::vector<TokenId> dv;
  if (k.draft_vocab)
    for (TokenId id = 0; id < 262; id += 3) dv.push_back(id);
  const Drafter d = tiny_drafter(k.head, k.mask, k.bf16, dv);
  test::TempDir dir;
  const Drafter back = round_trip(d, k.format, dir);
  expect_same_config(d.config(), back.config());
  expect_bit_identical(d, back);
  spectest::expect_same_drafts(d, back, spectest::tiny_target());
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (DrafterFormat f : {DrafterFormat::GGUF, DrafterFormat::HF}) {
    std::vector<SeqHead> heads = {SeqHead::Markov, SeqHead::None};
    if (f == DrafterFormat::HF) heads.insert(heads.end(), {SeqHead::Gated, SeqHead::Rnn});
    for (SeqHead h : heads)
      for (int mask : {-1, 7})
        for (bool bf16 : {true, false}) out.push_back({f, h, mask, bf16, false});
    out.push_back({f, SeqHead::Markov, -1, true, true});
    out.push_back({f, SeqHead::Markov, 7, false, true});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Formats, RoundTrip, testing::ValuesIn(cases()), case_name);

// ---- the GGUF as llama.cpp reads it ---------------------------------------------------

TEST(DrafterGGUF, HoldsWhatLlamaCppsDflashLoaderReads) {
  std::vector<TokenId> dv = {0, 2, 5, 9, 100, 261};
  const Drafter d = tiny_drafter(SeqHead::Markov, -1, true, dv);
  const auto& c = d.config();
  test::TempDir dir;
  const TargetInfo& t = spectest::tiny_target().info();
  ExportOptions opts;
  opts.mask_row = kMaskRow;
  export_drafter(d, t, DrafterFormat::GGUF, dir.file("d.gguf"), opts);
  io::GGUFFile f(dir.file("d.gguf"));
  io::GGUFFile target(t.path);
  EXPECT_EQ(f.get_string("general.architecture"), "dflash");
  EXPECT_EQ(f.get_int("dflash.block_count"), 1);
  EXPECT_EQ(f.get_int("dflash.embedding_length"), 64);
  EXPECT_EQ(f.get_int("dflash.attention.head_count"), 4);
  EXPECT_EQ(f.get_int("dflash.attention.head_count_kv"), 2);
  EXPECT_EQ(f.get_int("dflash.attention.key_length"), 16);
  EXPECT_EQ(f.get_int("dflash.block_size"), 5);
  EXPECT_TRUE(f.get_bool_or("dflash.sample_from_anchor", false));
  EXPECT_TRUE(f.get_bool_or("dflash.has_confidence_head", false));
  // llama.cpp taps layer INPUTS: dspark's output tap l is stored as l + 1.
  std::vector<int64_t> layers;
  for (int l : c.tap_layers) layers.push_back(l + 1);
  EXPECT_EQ(f.get_int_array("dflash.target_layers"), layers);
  EXPECT_EQ(f.get_int("tokenizer.ggml.mask_token_id"), kMaskRow);
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.tokens"), target.get_string_array("tokenizer.ggml.tokens"));
  EXPECT_EQ(f.get_int("tokenizer.ggml.eos_token_id"), 2);

  // Shapes as llama.cpp creates them (ne order), types.
  EXPECT_EQ(f.tensor("fc.weight").ne, (std::vector<int64_t>{64 * c.m(), 64}));
  EXPECT_EQ(f.tensor("fc.weight").type(), io::GGMLType::BF16);
  EXPECT_EQ(f.tensor("enc.output_norm.weight").type(), io::GGMLType::F32);
  EXPECT_EQ(f.tensor("markov_w1.weight").ne, (std::vector<int64_t>{32, 262}));
  EXPECT_EQ(f.tensor("markov_w2.weight").ne, (std::vector<int64_t>{32, 6}));  // draft rows only
  EXPECT_EQ(f.tensor("conf_proj.weight").ne, (std::vector<int64_t>{64 + 32, 1}));
  EXPECT_EQ(f.tensor("conf_proj.bias").ne, (std::vector<int64_t>{1}));
  EXPECT_EQ(f.tensor("token_embd.weight").ne, (std::vector<int64_t>{64, 262}));
  EXPECT_EQ(f.tensor("output.weight").ne, (std::vector<int64_t>{64, 6}));
  EXPECT_EQ(f.tensor("output.weight").type_id, target.tensor("output.weight").type_id);
  const auto& d2t = f.tensor("d2t");
  EXPECT_EQ(d2t.type(), io::GGMLType::I64);
  EXPECT_EQ(std::vector<int64_t>(reinterpret_cast<const int64_t*>(d2t.data),
                                 reinterpret_cast<const int64_t*>(d2t.data) + d2t.ne[0]),
            std::vector<int64_t>(dv.begin(), dv.end()));

  // The LM head rows are the target's own blocks; token_embd is the target's
  // embedding with the learned mask in the mask row.
  const at::Tensor head = io::dequantize_tensor(f.tensor("output.weight"), at::kFloat);
  const at::Tensor target_head = io::dequantize_tensor(target.tensor("output.weight"), at::kFloat);
  for (size_t i = 0; i < dv.size(); ++i) EXPECT_TRUE(at::equal(head[i], target_head[dv[i]])) << i;
  const at::Tensor embd = io::dequantize_tensor(f.tensor("token_embd.weight"), at::kFloat);
  const at::Tensor target_embd = io::dequantize_tensor(target.tensor("token_embd.weight"), at::kFloat);
  EXPECT_TRUE(at::equal(embd[kMaskRow], d.params().at("mask_embedding")));
  EXPECT_TRUE(at::equal(embd[10], target_embd[10].to(at::kBFloat16).to(at::kFloat)));

  // q/k rows in NeoX order: per head, even dspark rows first, then odd ones.
  const at::Tensor q = io::dequantize_tensor(f.tensor("blk.0.attn_q.weight"), at::kFloat);
  const at::Tensor ours = d.params().at("layers.0.attn_q.weight");
  for (int64_t h = 0; h < 4; ++h)
    for (int64_t j = 0; j < 8; ++j) {
      EXPECT_TRUE(at::equal(q[h * 16 + j], ours[h * 16 + 2 * j])) << h << " " << j;
      EXPECT_TRUE(at::equal(q[h * 16 + 8 + j], ours[h * 16 + 2 * j + 1])) << h << " " << j;
    }
  const at::Tensor kn = io::dequantize_tensor(f.tensor("blk.0.attn_k_norm.weight"), at::kFloat);
  const at::Tensor kn_ours = d.params().at("layers.0.attn_k_norm.weight");
  EXPECT_TRUE(at::equal(kn[1], kn_ours[2]));
  EXPECT_TRUE(at::equal(kn[8], kn_ours[1]));
  // V is not rotated: unchanged.
  EXPECT_TRUE(at::equal(io::dequantize_tensor(f.tensor("blk.0.attn_v.weight"), at::kFloat),
                        d.params().at("layers.0.attn_v.weight")));
}

TEST(DrafterGGUF, FixedMaskRowAndFullVocabularyShareTheTargetsTables) {
  const Drafter d = tiny_drafter(SeqHead::Markov, 7, true);
  test::TempDir dir;
  export_drafter(d, spectest::tiny_target().info(), DrafterFormat::GGUF, dir.file("d.gguf"));
  io::GGUFFile f(dir.file("d.gguf"));
  EXPECT_EQ(f.get_int("tokenizer.ggml.mask_token_id"), 7);
  EXPECT_EQ(f.find_tensor("token_embd.weight"), nullptr);
  EXPECT_EQ(f.find_tensor("output.weight"), nullptr);
  EXPECT_EQ(f.find_tensor("d2t"), nullptr);
  EXPECT_EQ(f.tensor("markov_w2.weight").ne, (std::vector<int64_t>{32, 262}));
}

TEST(DrafterGGUF, DraftVocabularyWithoutTheOtherRowsImportsZeros) {
  std::vector<TokenId> dv = {1, 4, 200};
  const Drafter d = tiny_drafter(SeqHead::Markov, 7, true, dv);
  test::TempDir dir;
  const TargetInfo& t = spectest::tiny_target().info();
  export_drafter(d, t, DrafterFormat::GGUF, dir.file("d.gguf"));
  // A file made elsewhere has no dspark.* keys: drop ours.
  io::GGUFFile f(dir.file("d.gguf"));
  io::GGUFWriter w;
  for (const auto& [k, v] : f.metadata())
    if (!k.starts_with("dspark.") && k != "general.alignment") w.set(k, v);
  for (const auto& ti : f.tensors())
    w.add_tensor(ti.name, ti.type_id, ti.ne, std::string_view(reinterpret_cast<const char*>(ti.data), ti.n_bytes));
  w.write(dir.file("foreign.gguf"));
  InteropNotes notes;
  const Drafter back = import_drafter(dir.file("foreign.gguf"), t, DrafterFormat::GGUF, &notes);
  const at::Tensor w2 = back.params().at("markov_w2.weight");
  for (TokenId id : dv) EXPECT_TRUE(at::equal(w2[id], d.params().at("markov_w2.weight")[id])) << id;
  EXPECT_EQ(w2[0].abs().max().item<float>(), 0.f);
  EXPECT_TRUE(back.config().sts_thresholds.empty());
  bool noted = false;
  for (const auto& n : notes) noted |= n.find("set to zero") != std::string::npos;
  EXPECT_TRUE(noted);
  spectest::expect_same_drafts(d, back, spectest::tiny_target());  // drafting reads only the draft rows
}

// ---- refusals -------------------------------------------------------------------------

void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

TEST(DrafterInterop, RefusesHeadsAFormatCannotHold) {
  test::TempDir dir;
  const TargetInfo& t = spectest::tiny_target().info();
  ExportOptions opts;
  opts.mask_row = kMaskRow;
  for (SeqHead h : {SeqHead::Gated, SeqHead::Rnn, SeqHead::Elman})
    expect_error([&] { export_drafter(tiny_drafter(h, -1, true), t, DrafterFormat::GGUF, dir.file("x.gguf"), opts); },
                 {"llama.cpp's dflash GGUF", "'" + to_string(h) + "' head cannot be represented", "markov"});
  expect_error([&] { export_drafter(tiny_drafter(SeqHead::Elman, -1, true), t, DrafterFormat::HF, dir.file("x"), opts); },
               {"DeepSpec", "'elman' head", "markov, gated, rnn"});
  Drafter none = tiny_drafter(SeqHead::None, -1, true);
  none.mutable_params().at("markov_w2.weight")[3][1] = 0.5f;
  for (DrafterFormat f : {DrafterFormat::GGUF, DrafterFormat::HF})
    expect_error([&] { export_drafter(none, t, f, dir.file("y"), opts); }, {"'none'", "markov_w2 is not zero"});
  EXPECT_FALSE(fs::exists(dir.file("x.gguf")));
}

TEST(DrafterInterop, RefusesAnotherTargetAndSaysWhenNoMaskRowIsSpare) {
  test::TempDir dir;
  const Drafter d = tiny_drafter(SeqHead::Markov, -1, true);
  TargetInfo other = spectest::tiny_target().info();
  other.id = "llama/other";
  expect_error([&] { export_drafter(d, other, DrafterFormat::GGUF, dir.file("x.gguf")); }, {"llama/other"});
  // Every control token of the tiny vocabulary is a declared special id.
  expect_error([&] { export_drafter(d, spectest::tiny_target().info(), DrafterFormat::HF, dir.file("x")); },
               {"no spare control token", "--mask-row"});

  ExportOptions opts;
  opts.mask_row = kMaskRow;
  export_drafter(d, spectest::tiny_target().info(), DrafterFormat::GGUF, dir.file("d.gguf"), opts);
  expect_error([&] { import_drafter(dir.file("d.gguf"), other, DrafterFormat::GGUF); },
               {"built for '" + d.config().target_id + "'", "llama/other"});
  TargetInfo wide = spectest::tiny_target().info();
  wide.hidden = 128;
  wide.id = d.config().target_id;
  expect_error([&] { import_drafter(dir.file("d.gguf"), wide, DrafterFormat::GGUF); }, {"hidden size 64", "128"});
}

// Rewrites `src` with metadata `key` set to `value` (or removed when
// `value` is null) and, optionally, one extra tensor.
void rewrite_gguf(const std::string& src, const std::string& dst, const std::string& key,
                  std::optional<io::GGUFValue> value, bool extra_tensor = false) {
  io::GGUFFile f(src);
  io::GGUFWriter w;
  for (const auto& [k, v] : f.metadata())
    if (k != key && k != "general.alignment") w.set(k, v);
  if (value) w.set(key, *value);
  for (const auto& ti : f.tensors())
    w.add_tensor(ti.name, ti.type_id, ti.ne, std::string_view(reinterpret_cast<const char*>(ti.data), ti.n_bytes));
  if (extra_tensor) w.add_tensor("blk.0.attn_post_norm.weight", at::ones({64}));
  w.write(dst);
}

TEST(DrafterInterop, ImportRefusesGGUFFeaturesDsparkLacks) {
  test::TempDir dir;
  const TargetInfo& t = spectest::tiny_target().info();
  export_drafter(tiny_drafter(SeqHead::Markov, 7, true), t, DrafterFormat::GGUF, dir.file("d.gguf"));
  namespace g = io::gguf;
  const std::vector<std::tuple<std::string, std::optional<io::GGUFValue>, std::string>> cases = {
      {"dflash.sample_from_anchor", g::boolean(false), "bonus-anchor"},
      {"dflash.attention.causal", g::boolean(true), "causal"},
      {"dflash.attention.sliding_window", g::u32(64), "sliding-window"},
      {"dflash.final_logit_softcapping", g::f32(30.f), "softcaps"},
      {"dflash.rope.dimension_count", g::u32(8), "RoPE covers 8 of 16"},
      {"dflash.hidden_activation", g::string("gelu"), "gelu"},
      {"dflash.target_layers", g::i32_array({0, 2}), "embedding output"},
      {"dflash.block_size", std::nullopt, "dflash.block_size"},
      {"general.architecture", g::string("llama"), "expected 'dflash'"},
  };
  for (const auto& [key, value, part] : cases) {
    rewrite_gguf(dir.file("d.gguf"), dir.file("bad.gguf"), key, value);
    expect_error([&] { import_drafter(dir.file("bad.gguf"), t, DrafterFormat::GGUF); }, {dir.file("bad.gguf"), part});
  }
  rewrite_gguf(dir.file("d.gguf"), dir.file("bad.gguf"), "", std::nullopt, true);
  expect_error([&] { import_drafter(dir.file("bad.gguf"), t, DrafterFormat::GGUF); },
               {"unexpected tensor 'blk.0.attn_post_norm.weight'"});
}

TEST(DrafterInterop, ImportRefusesHFFeaturesDsparkLacks) {
  test::TempDir dir;
  const TargetInfo& t = spectest::tiny_target().info();
  export_drafter(tiny_drafter(SeqHead::Markov, 7, true), t, DrafterFormat::HF, dir.file("hf"));
  const std::string cfg_path = dir.file("hf") + "/config.json";
  const nlohmann::json good = nlohmann::json::parse(test::read_bytes(cfg_path));
  const std::vector<std::tuple<std::string, nlohmann::json, std::string>> cases = {
      {"architectures", {"Gemma4DSparkModel"}, "Gemma4DSparkModel"},
      {"attention_bias", true, "attention_bias"},
      {"hidden_act", "gelu", "gelu"},
      {"target_layer_ids", {-1, 1}, "embedding output"},
      {"markov_head_type", "selector", "markov_head_type 'selector'"},
      {"markov_rank", 48, "markov_rank must be a positive multiple of 32"},
      {"num_target_layers", 9, "num_target_layers is 9"},
      {"vocab_size", 300, "vocabulary of 300 tokens"},
      {"rope_scaling", {{"type", "yarn"}}, "rope_scaling"},
  };
  for (const auto& [key, value, part] : cases) {
    nlohmann::json j = good;
    j[key] = value;
    test::write_bytes(cfg_path, j.dump());
    expect_error([&] { import_drafter(dir.file("hf"), t, DrafterFormat::HF); }, {"config.json", part});
  }
  test::write_bytes(cfg_path, good.dump());
  EXPECT_NO_THROW(import_drafter(dir.file("hf"), t, DrafterFormat::HF));
  expect_error([&] { detect_drafter_format(dir.file("nothing")); }, {"cannot open"});
  expect_error([&] { detect_drafter_format(cfg_path); }, {"not a GGUF file"});
}

// A DeepSpec drafter without a Markov head or confidence head imports with
// those parts zero: the drafts are the backbone's argmax alone.
TEST(DrafterInterop, HFWithoutMarkovOrConfidenceHeadImportsZeros) {
  test::TempDir dir;
  const TargetInfo& t = spectest::tiny_target().info();
  const Drafter d = tiny_drafter(SeqHead::None, 7, true);
  export_drafter(d, t, DrafterFormat::HF, dir.file("hf"));
  const std::string cfg_path = dir.file("hf") + "/config.json";
  nlohmann::json j = nlohmann::json::parse(test::read_bytes(cfg_path));
  j["markov_rank"] = 0;
  j["enable_confidence_head"] = false;
  j.erase("dspark");
  j["mask_token_id"] = 7;
  test::write_bytes(cfg_path, j.dump());
  auto st = io::load_safetensors(dir.file("hf") + "/model.safetensors");
  std::vector<std::pair<std::string, at::Tensor>> kept;
  for (auto& [name, tensor] : st.tensors)
    if (!name.starts_with("markov_head") && !name.starts_with("confidence_head")) kept.emplace_back(name, tensor);
  io::save_safetensors(dir.file("hf") + "/model.safetensors", kept);
  InteropNotes notes;
  const Drafter back = import_drafter(dir.file("hf"), t, DrafterFormat::HF, &notes);
  EXPECT_EQ(back.config().seq_head, SeqHead::None);
  EXPECT_EQ(back.config().mask_token_id, -1);  // a foreign table's mask row is the learned mask
  EXPECT_EQ(back.params().at("conf_proj.weight").abs().max().item<float>(), 0.f);
  EXPECT_EQ(notes.size(), 3u);
  EXPECT_TRUE(at::equal(back.params().at("fc.weight"), d.params().at("fc.weight")));
}

// ---- the commands -------------------------------------------------------------------

// `dspark export` / `dspark import` on the tiny target: an fp32 drafter comes
// back byte for byte through HF; a head GGUF cannot hold is one error line and
// exit status 2.
TEST(DrafterInteropCli, ExportImportRoundTripAndRefusal) {
  test::TempDir dir;
  const std::string model = spectest::tiny_target().info().path;
  auto run = [&](const std::string& args) {
    const std::string err = dir.file("stderr");
    const int rc = std::system((std::string(DSPARK_BINARY) + " " + args + " -m " + model + " 2>" + err).c_str());
    return std::make_pair(WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, test::read_bytes(err));
  };
  const std::string d = dir.file("d"), hf = dir.file("hf"), back = dir.file("back");
  ASSERT_EQ(run("init-drafter --out " + d + " --gamma 4 --seed 3").first, 0);
  auto [rc, err] = run("export --drafter " + d + " --format hf -o " + hf);
  EXPECT_EQ(rc, 2);
  EXPECT_NE(err.find("--mask-row"), std::string::npos) << err;
  std::tie(rc, err) = run("export --drafter " + d + " --format hf --mask-row 2 -o " + hf);
  ASSERT_EQ(rc, 0) << err;
  EXPECT_NE(err.find("embed_tokens row 2"), std::string::npos) << err;
  std::tie(rc, err) = run("import --from " + hf + " -o " + back);
  ASSERT_EQ(rc, 0) << err;
  EXPECT_NE(err.find(", f32,"), std::string::npos) << err;
  EXPECT_EQ(test::read_bytes(back + "/model.safetensors"), test::read_bytes(d + "/model.safetensors"));
  const auto ja = nlohmann::json::parse(test::read_bytes(d + "/dspark.json"));
  const auto jb = nlohmann::json::parse(test::read_bytes(back + "/dspark.json"));
  EXPECT_EQ(ja.at("config"), jb.at("config"));
  EXPECT_EQ(jb.at("imported_from").at("format"), "hf");
  EXPECT_EQ(run("export --drafter " + d + " --format hf --mask-row 2 -o " + hf).first, 2);  // exists: --force

  ASSERT_EQ(run("init-drafter --out " + dir.file("g") + " --head gated").first, 0);
  std::tie(rc, err) = run("export --drafter " + dir.file("g") + " --format gguf --mask-row 2 -o " + dir.file("g.gguf"));
  EXPECT_EQ(rc, 2);
  EXPECT_EQ(err.rfind("error: llama.cpp's dflash GGUF holds only these sequential heads: markov", 0), 0u) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  EXPECT_FALSE(fs::exists(dir.file("g.gguf")));
}

// ---- the shipped drafters ------------------------------------------------------------

// Both formats give `dir`'s drafter back bit for bit, with the same greedy
// drafts and confidences on the context of `ids` (a real prompt).
void expect_shipped_round_trip(const std::string& dir, LoadedModel& m, const std::vector<TokenId>& ids,
                               const std::string& mask_row_note) {
  const Drafter d = load_drafter(dir);
  ASSERT_FALSE(d.config().draft_vocab.empty());
  // The calibration record travels too (expect_same_config compares it).
  ASSERT_NE(d.config().sts_report.find("\"auroc\""), std::string::npos) << d.config().sts_report;
  ASSERT_LT(d.config().mask_token_id, 0);
  for (DrafterFormat f : {DrafterFormat::GGUF, DrafterFormat::HF}) {
    test::TempDir tmp;
    const std::string path = out_path(tmp, f);
    const InteropNotes notes = export_drafter(d, m.target->info(), f, path);
    ASSERT_FALSE(notes.empty());
    EXPECT_NE(notes[0].find(mask_row_note), std::string::npos) << notes[0];
    const Drafter back = import_drafter(path, m.target->info(), f);
    expect_same_config(d.config(), back.config());
    expect_bit_identical(d, back);
    Drafter a = d, b = back;
    a.bind(*m.target);
    b.bind(*m.target);
    KVCache cache = m.target->new_cache();
    const at::Tensor feats = m.target->forward_one(cache, ids, Logits::None, TapRequest{a.tap_layers(), false}).taps;
    DraftState sa, sb;
    a.append_context(sa, feats.narrow(0, 0, feats.size(0) - 1));
    b.append_context(sb, feats.narrow(0, 0, feats.size(0) - 1));
    SamplingParams greedy;
    greedy.temperature = 0.f;
    Rng rng(1);
    const Draft da = a.draft(sa, ids.back(), 0, greedy, rng), db = b.draft(sb, ids.back(), 0, greedy, rng);
    EXPECT_EQ(da.tokens, db.tokens) << to_string(f);
    EXPECT_EQ(da.conf_logits, db.conf_logits) << to_string(f);
  }
}

TEST(DrafterInterop, ShippedSmolLM2DrafterRoundTripsThroughBothFormats) {
  DSPARK_REAL_MODEL(m);
  // Row 16 is <empty_output>, never emitted in chat.
  expect_shipped_round_trip(DSPARK_SOURCE_DIR "/drafters/smollm2", m, spectest::dev_prompt_ids(0), "row 16");
}

TEST(DrafterInterop, ShippedGemma3DrafterRoundTripsThroughBothFormats) {
  DSPARK_REQUIRE_GEMMA();
  LoadedModel m = LoadedModel::load(test::gemma_model_path());
  const std::vector<TokenId> ids =
      m.encode_prompt("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n", false);
  // Gemma 3's last row, <unused6241>, is never emitted.
  expect_shipped_round_trip(DSPARK_SOURCE_DIR "/drafters/gemma3", m, ids, "row 262143");
}

}  // namespace
