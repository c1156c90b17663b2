// The drafter checkpoint format (dspark-method.md §8, docs/checkpoint-format.md):
// bit-exact fp32 round trips and bf16 rounding for every head type, the
// refusals (obsolete and unknown variants, another target's id or dims,
// missing / misshapen tensors, truncated weights, malformed JSON, a missing
// directory), legacy "dflash" directories, and saves that fail part-way.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <csignal>
#include <cstring>
#include <functional>
#include <map>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dspark/error.hpp"
#include "dspark/io/safetensors.hpp"
#include "dspark/speculative/checkpoint.hpp"
#include "dspark/speculative/speculative.hpp"
#include "spec_test_util.hpp"

namespace {

using namespace dspark;
namespace fs = std::filesystem;
using json = nlohmann::json;
using test::TempDir;
using test::message_of;

DrafterConfig tiny_cfg(SeqHead head) {
  DrafterConfig c = spectest::small_config(spectest::tiny_target().info(), head, 5);
  c.sts_thresholds = {0.0, 0.25, 0.5, 0.625, 0.75};
  c.sts_temperatures = {1.0, 1.5, 0.75, 2.0, 1.25};
  c.draft_vocab = {0, 2, 7, 100, 261};
  return c;
}

// Random values everywhere a trained drafter of that head has them: a
// drafter without a sequential head keeps markov_w2 at its zero init (the
// loader refuses a "none" config with a trained one, see below).
Drafter tiny_drafter(SeqHead head, uint64_t seed = 1) {
  Drafter d = spectest::perturbed_drafter(tiny_cfg(head), seed);
  if (head == SeqHead::None) d.mutable_params().at("markov_w2.weight").zero_();
  return d;
}

void expect_same_config(const DrafterConfig& a, const DrafterConfig& b) {
  EXPECT_EQ(a.gamma, b.gamma);
  EXPECT_EQ(a.n_layers, b.n_layers);
  EXPECT_EQ(a.n_heads, b.n_heads);
  EXPECT_EQ(a.n_kv_heads, b.n_kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.ffn, b.ffn);
  EXPECT_EQ(a.markov_rank, b.markov_rank);
  EXPECT_EQ(a.tap_layers, b.tap_layers);
  EXPECT_EQ(a.seq_head, b.seq_head);
  EXPECT_EQ(a.mask_token_id, b.mask_token_id);
  EXPECT_EQ(a.rope_base, b.rope_base);
  EXPECT_EQ(a.eps, b.eps);
  EXPECT_EQ(a.target_id, b.target_id);
  EXPECT_EQ(a.hidden, b.hidden);
  EXPECT_EQ(a.vocab, b.vocab);
  EXPECT_EQ(a.sts_thresholds, b.sts_thresholds);
  EXPECT_EQ(a.sts_temperatures, b.sts_temperatures);
  EXPECT_EQ(a.draft_vocab, b.draft_vocab);
}

// Empty when `got` holds exactly the tensors of `want` (bit patterns, so
// -0.0 and NaN payloads count too); otherwise which ones differ.
std::string param_mismatch(const std::map<std::string, at::Tensor>& got,
                           const std::map<std::string, at::Tensor>& want) {
  std::vector<std::string> bad;
  for (const auto& [name, t] : want) {
    auto it = got.find(name);
    if (it == got.end()) {
      bad.push_back(name + " (missing)");
      continue;
    }
    const at::Tensor g = it->second.contiguous(), w = t.contiguous();
    if (g.scalar_type() != at::kFloat || g.sizes() != w.sizes() ||
        std::memcmp(g.data_ptr(), w.data_ptr(), static_cast<size_t>(w.numel()) * 4) != 0)
      bad.push_back(name);
  }
  for (const auto& [name, t] : got)
    if (!want.count(name)) bad.push_back(name + " (unexpected)");
  if (bad.empty()) return "";
  std::string m = std::to_string(bad.size()) + " of " + std::to_string(want.size()) + " tensors differ:";
  for (size_t i = 0; i < bad.size() && i < 4; ++i) m += " " + bad[i];
  return m;
}

json read_json(const std::string& dir) { return json::parse(test::read_bytes(dir + "/dspark.json")); }
void write_json(const std::string& dir, const json& j) { test::write_bytes(dir + "/dspark.json", j.dump(2)); }

// Replaces model.safetensors with `tensors` (and, when asked, the recorded size).
void rewrite_weights(const std::string& dir, const std::map<std::string, at::Tensor>& tensors,
                     bool update_size = true) {
  std::vector<std::pair<std::string, at::Tensor>> v(tensors.begin(), tensors.end());
  const std::string path = dir + "/model.safetensors";
  io::save_safetensors(path, v);
  if (update_size) {
    json j = read_json(dir);
    j["weights_bytes"] = static_cast<int64_t>(fs::file_size(path));
    write_json(dir, j);
  }
}

// ---- round trips -------------------------------------------------------------------

class CheckpointRoundTrip : public ::testing::TestWithParam<SeqHead> {};

TEST_P(CheckpointRoundTrip, Fp32IsBitExact) {
  TempDir dir;
  const std::string d = dir.file("drafter");
  const Drafter src = tiny_drafter(GetParam());
  save_drafter(src, d, /*bf16=*/false);
  const Drafter got = load_drafter(d);
  expect_same_config(got.config(), src.config());
  EXPECT_EQ(param_mismatch(got.params(), src.params()), "");

  const json j = read_json(d);
  EXPECT_EQ(j.at("kind"), "dspark-drafter");
  EXPECT_EQ(j.at("variant"), "dspark");
  EXPECT_EQ(j.at("version"), 1);
  EXPECT_EQ(j.at("dtype"), "f32");
  EXPECT_EQ(j.at("config").at("seq_head"), to_string(GetParam()));
  EXPECT_EQ(j.at("weights_bytes").get<int64_t>(), static_cast<int64_t>(fs::file_size(d + "/model.safetensors")));
  std::vector<std::string> names;
  for (const auto& [n, s] : Drafter::param_spec(src.config())) names.push_back(n);
  EXPECT_EQ(j.at("param_names").get<std::vector<std::string>>(), names);

  // The loaded drafter drafts exactly what the original drafts.
  Drafter a = src, b = got;
  a.bind(spectest::tiny_target());
  b.bind(spectest::tiny_target());
  DraftState sa, sb;
  const at::Tensor feats = at::ones({6, 64});
  a.append_context(sa, feats);
  b.append_context(sb, feats);
  SamplingParams greedy;
  greedy.temperature = 0;
  Rng r1(1), r2(1);
  const Draft x = a.draft(sa, 12, 5, greedy, r1), y = b.draft(sb, 12, 5, greedy, r2);
  EXPECT_EQ(x.tokens, y.tokens);
  EXPECT_EQ(x.conf_logits, y.conf_logits);
}

TEST_P(CheckpointRoundTrip, Bf16EqualsRoundedParameters) {
  TempDir dir;
  const std::string d = dir.file("drafter");
  const Drafter src = tiny_drafter(GetParam(), 2);
  save_drafter(src, d, /*bf16=*/true);
  EXPECT_EQ(read_json(d).at("dtype"), "bf16");
  for (const auto& [name, t] : io::load_safetensors(d + "/model.safetensors").tensors)
    EXPECT_EQ(t.scalar_type(), at::kBFloat16) << name;
  std::map<std::string, at::Tensor> rounded;
  for (const auto& [name, t] : src.params()) rounded[name] = t.to(at::kBFloat16).to(at::kFloat);
  const Drafter got = load_drafter(d);
  expect_same_config(got.config(), src.config());
  EXPECT_EQ(param_mismatch(got.params(), rounded), "");
}

INSTANTIATE_TEST_SUITE_P(CheckpointHeads, CheckpointRoundTrip, ::testing::ValuesIn(spectest::all_heads()),
                         [](const ::testing::TestParamInfo<SeqHead>& i) { return to_string(i.param); });

TEST(Checkpoint, ExtraKeysAndResave) {
  TempDir dir;
  const std::string d = dir.file("nested/drafter");
  save_drafter(tiny_drafter(SeqHead::Markov, 1), d, true, {{"note", "first"}, {"train", {{"steps", 10}}}});
  const json j = read_json(d);
  EXPECT_EQ(j.at("note"), "first");
  EXPECT_EQ(j.at("train").at("steps"), 10);
  EXPECT_EQ(read_drafter_json(d), j);
  // Saving again replaces both files.
  const Drafter second = tiny_drafter(SeqHead::Gated, 2);
  save_drafter(second, d, false);
  const Drafter got = load_drafter(d);
  EXPECT_EQ(got.config().seq_head, SeqHead::Gated);
  EXPECT_EQ(param_mismatch(got.params(), second.params()), "");
  EXPECT_FALSE(read_json(d).contains("note"));
}

// ---- refusals ------------------------------------------------------------------------

// A valid saved drafter to break in various ways.
struct Saved {
  TempDir tmp;
  std::string dir = tmp.file("drafter");
  Drafter drafter = tiny_drafter(SeqHead::Markov, 4);
  Saved() { save_drafter(drafter, dir, false); }
  std::string load_error() {
    return message_of<FormatError>([&] { load_drafter(dir); });
  }
};

TEST(Checkpoint, RefusesObsoleteFormatWithoutVariant) {
  Saved s;
  json j = read_json(s.dir);
  j.erase("variant");
  write_json(s.dir, j);
  const std::string m = s.load_error();
  EXPECT_MENTIONS(m, "dspark.json");
  EXPECT_MENTIONS(m, "obsolete");
  EXPECT_MENTIONS(m, "retrain");
  EXPECT_MENTIONS(m, "dspark train");
}

TEST(Checkpoint, RefusesUnknownVariant) {
  Saved s;
  json j = read_json(s.dir);
  j["variant"] = "eagle3";
  write_json(s.dir, j);
  const std::string m = s.load_error();
  EXPECT_MENTIONS(m, "unknown variant 'eagle3'");
  EXPECT_MENTIONS(m, "dflash");
}

TEST(Checkpoint, RefusesNonFiniteWeights) {
  TempDir tmp;
  Drafter d = tiny_drafter(SeqHead::Markov, 4);
  auto params = d.params();
  const std::string name = params.begin()->first;
  params.begin()->second = params.begin()->second.clone();
  params.begin()->second.view(-1)[0] = NAN;
  const std::string dir = tmp.file("nan");
  save_drafter(Drafter(d.config(), params), dir, false);
  const std::string m = message_of<FormatError>([&] { load_drafter(dir); });
  EXPECT_MENTIONS(m, "tensor '" + name + "' holds NaN or infinite values");
}

TEST(Checkpoint, RefusesAnotherKindOrANewerVersion) {
  Saved s;
  json j = read_json(s.dir);
  ASSERT_EQ(j.at("kind"), "dspark-drafter");
  ASSERT_EQ(j.at("version"), 1);
  j["kind"] = "sps-profile";
  write_json(s.dir, j);
  std::string m = s.load_error();
  EXPECT_MENTIONS(m, "'kind' is \"sps-profile\", expected \"dspark-drafter\"");
  j["kind"] = "dspark-drafter";
  j["version"] = 2;
  write_json(s.dir, j);
  m = s.load_error();
  EXPECT_MENTIONS(m, "format version 2, this build reads versions 1..1 (written by a newer dspark)");
  j["version"] = "1";
  write_json(s.dir, j);
  EXPECT_MENTIONS(s.load_error(), "format version \"1\"");
  j["version"] = 1;
  write_json(s.dir, j);
  EXPECT_NO_THROW(load_drafter(s.dir));
}

TEST(Checkpoint, RefusesAnotherTargetsId) {
  TempDir tmp;
  const std::string d = tmp.file("drafter");
  DrafterConfig c = tiny_cfg(SeqHead::Markov);
  c.target_id = "llama/some-other-model";
  save_drafter(Drafter::init(c, 1), d);
  Drafter got = load_drafter(d);  // loading alone succeeds: the target is not known yet
  TargetModel& t = spectest::tiny_target();
  const std::string m = message_of<InvalidArgument>([&] { check_drafter_matches(got.config(), t.info()); });
  EXPECT_MENTIONS(m, "llama/some-other-model");
  EXPECT_MENTIONS(m, t.info().id);
  // generate_speculative refuses it too.
  got.bind(t);
  const std::string m2 = message_of<InvalidArgument>(
      [&] { generate_speculative(t, got, {5, 6, 7}, spectest::greedy_options(4, {}), {}); });
  EXPECT_MENTIONS(m2, "llama/some-other-model");
}

TEST(Checkpoint, RefusesAnotherTargetsDims) {
  TargetModel& t = spectest::tiny_target();
  for (auto [field, value] : {std::pair<std::string, int64_t>{"hidden", 96}, {"vocab", 300}}) {
    TempDir tmp;
    const std::string d = tmp.file("drafter");
    DrafterConfig c = tiny_cfg(SeqHead::None);
    (field == "hidden" ? c.hidden : c.vocab) = value;
    save_drafter(Drafter::init(c, 1), d);
    const Drafter got = load_drafter(d);
    const std::string m = message_of<InvalidArgument>([&] { check_drafter_matches(got.config(), t.info()); });
    const int64_t target_value = field == "hidden" ? t.info().hidden : t.info().vocab;
    EXPECT_MENTIONS(m, field + " " + std::to_string(value));
    EXPECT_MENTIONS(m, field + " " + std::to_string(target_value));
  }
}

TEST(Checkpoint, RefusesMissingTensor) {
  Saved s;
  auto tensors = io::load_safetensors(s.dir + "/model.safetensors").tensors;
  tensors.erase("layers.0.ffn_up.weight");
  rewrite_weights(s.dir, tensors);
  const std::string m = s.load_error();
  EXPECT_MENTIONS(m, "model.safetensors");
  EXPECT_MENTIONS(m, "missing");
  EXPECT_MENTIONS(m, "layers.0.ffn_up.weight");
}

TEST(Checkpoint, RefusesWrongTensorShape) {
  Saved s;
  auto tensors = io::load_safetensors(s.dir + "/model.safetensors").tensors;
  tensors["conf_proj.weight"] = at::zeros({1, 10});
  rewrite_weights(s.dir, tensors);
  const std::string m = s.load_error();
  EXPECT_MENTIONS(m, "conf_proj.weight");
  EXPECT_MENTIONS(m, "[1, 10]");
  EXPECT_MENTIONS(m, "[1, 96]");
}

TEST(Checkpoint, RefusesUnexpectedTensor) {
  Saved s;
  auto tensors = io::load_safetensors(s.dir + "/model.safetensors").tensors;
  tensors["elman.wh"] = at::zeros({32, 32});
  rewrite_weights(s.dir, tensors);
  const std::string m = s.load_error();
  EXPECT_MENTIONS(m, "unexpected");
  EXPECT_MENTIONS(m, "elman.wh");
}

TEST(Checkpoint, RefusesTruncatedWeights) {
  Saved s;
  const std::string path = s.dir + "/model.safetensors";
  const std::string bytes = test::read_bytes(path);
  test::write_bytes(path, bytes.substr(0, bytes.size() / 2));
  std::string m = s.load_error();
  EXPECT_MENTIONS(m, "model.safetensors");
  EXPECT_MENTIONS(m, "weights_bytes");
  EXPECT_MENTIONS(m, std::to_string(bytes.size()));
  // Without the recorded size the safetensors reader still refuses it.
  json j = read_json(s.dir);
  j.erase("weights_bytes");
  write_json(s.dir, j);
  m = s.load_error();
  EXPECT_MENTIONS(m, "model.safetensors");
  // Only the 8-byte header length left.
  test::write_bytes(path, bytes.substr(0, 8));
  m = s.load_error();
  EXPECT_MENTIONS(m, "model.safetensors");
}

TEST(Checkpoint, RefusesMalformedJson) {
  Saved s;
  test::write_bytes(s.dir + "/dspark.json", "{\"variant\": \"dspark\", \"config\": ");
  const std::string m = s.load_error();
  EXPECT_MENTIONS(m, "dspark.json");
  EXPECT_MENTIONS(m, "invalid JSON");
  test::write_bytes(s.dir + "/dspark.json", "[1, 2, 3]");
  EXPECT_MENTIONS(s.load_error(), "dspark.json");
}

TEST(Checkpoint, RefusesMalformedFields) {
  struct Case {
    const char* what;
    std::function<void(json&)> edit;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {"gamma of the wrong type", [](json& j) { j["config"]["gamma"] = "seven"; }, {"gamma", "wrong type"}},
      {"gamma out of range", [](json& j) { j["config"]["gamma"] = 0; }, {"gamma"}},
      {"no dims", [](json& j) { j.erase("dims"); }, {"dims"}},
      {"no target_id", [](json& j) { j.erase("target_id"); }, {"target_id"}},
      {"no tap_layers", [](json& j) { j["config"].erase("tap_layers"); }, {"tap_layers"}},
      {"d_draft differs", [](json& j) { j["config"]["d_draft"] = 128; }, {"d_draft is 128", "hidden_size ="}},
      {"unknown seq_head", [](json& j) { j["config"]["seq_head"] = "lstm"; }, {"lstm", "dspark.json"}},
      {"weights_bytes of the wrong type", [](json& j) { j["weights_bytes"] = "many"; }, {"weights_bytes"}},
      {"mask_token_id of the wrong type", [](json& j) { j["config"]["mask_token_id"] = "none"; },
       {"mask_token_id"}},
      {"too few STS thresholds", [](json& j) { j["config"]["sts"]["thresholds"] = {0.5, 0.5}; },
       {"expected 5 thresholds", "got 2"}},
      {"STS threshold above 1", [](json& j) { j["config"]["sts"]["thresholds"][2] = 1.5; },
       {"thresholds must lie in [0, 1]", "1.5"}},
      {"too many STS temperatures", [](json& j) { j["config"]["sts"]["temperatures"].push_back(1.0); },
       {"expected 5 temperatures", "got 6"}},
      {"gamma not an integer", [](json& j) { j["config"]["gamma"] = 4.5; }, {"'gamma'", "must be an integer", "4.5"}},
      {"a tap layer not an integer", [](json& j) { j["config"]["tap_layers"][1] = 1.25; },
       {"'tap_layers' element 1", "must be an integer", "1.25"}},
      {"a draft-vocabulary id not an integer", [](json& j) { j["config"]["draft_vocab"][2] = 7.5; },
       {"'draft_vocab' element 2", "must be an integer", "7.5"}},
      {"tap layers in reverse order", [](json& j) { j["config"]["tap_layers"] = {1, 0}; },
       {"tap_layers must be strictly ascending", "got [1,0]"}},
      {"a repeated tap layer", [](json& j) { j["config"]["tap_layers"][1] = j["config"]["tap_layers"][0]; },
       {"tap_layers must be strictly ascending"}},
      {"an STS threshold that is not a number", [](json& j) { j["config"]["sts"]["thresholds"][2] = "x"; },
       {"'thresholds' element 2", "must be a number", "\"x\""}},
      {"a negative draft-vocabulary id", [](json& j) { j["config"]["draft_vocab"][0] = -3; }, {"draft_vocab", "-3"}},
      {"n_layers beyond int", [](json& j) { j["config"]["n_layers"] = 4294967297LL; },
       {"'n_layers'", "in range", "4294967297"}},
      {"vocab_size not an integer", [](json& j) { j["dims"]["vocab_size"] = 262.5; }, {"'vocab_size'", "262.5"}},
      {"a negative RMSNorm epsilon", [](json& j) { j["dims"]["eps"] = -1.0; }, {"eps", "(0, 1)", "-1"}},
      {"a zero RMSNorm epsilon", [](json& j) { j["dims"]["eps"] = 0.0; }, {"eps", "(0, 1)"}},
      {"a RoPE base of 0", [](json& j) { j["config"]["rope_base"] = 0; }, {"rope_base", "above 1", "0"}},
      {"a negative RoPE base", [](json& j) { j["config"]["rope_base"] = -1; }, {"rope_base", "-1"}},
      {"no RoPE base", [](json& j) { j["config"].erase("rope_base"); }, {"missing key 'rope_base'"}},
      {"no RMSNorm epsilon", [](json& j) { j["dims"].erase("eps"); }, {"dims", "missing key 'eps'"}},
      {"an epsilon far out of range", [](json& j) { j["dims"]["eps"] = 1e300; }, {"(0, 1), got 1e+300"}},
      {"a config that is null", [](json& j) { j["config"] = nullptr; }, {"'config' must be an object, got null"}},
      {"dims that are a string", [](json& j) { j["dims"] = "x"; }, {"'dims' must be an object, got string \"x\""}},
      {"STS that is a string", [](json& j) { j["config"]["sts"] = "x"; }, {"'sts' must be an object, got string"}},
      {"param_names that are a string", [](json& j) { j["param_names"] = "x"; }, {"'param_names'", "wrong type"}},
      {"an unknown dtype", [](json& j) { j["dtype"] = "garbage"; }, {"'dtype'", "garbage", "bf16"}},
      {"a dtype of the wrong type", [](json& j) { j["dtype"] = 16; }, {"'dtype'", "16"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    Saved s;
    json j = read_json(s.dir);
    c.edit(j);
    write_json(s.dir, j);
    const std::string m = s.load_error();
    for (const auto& part : c.parts) EXPECT_MENTIONS(m, part);
  }
}

// Integral floats lose nothing: 5.0 reads as 5.
TEST(Checkpoint, IntegralFloatsReadAsIntegers) {
  Saved s;
  json j = read_json(s.dir);
  j["config"]["gamma"] = 5.0;
  j["config"]["draft_vocab"][1] = 2.0;
  write_json(s.dir, j);
  const Drafter d = load_drafter(s.dir);
  EXPECT_EQ(d.config().gamma, 5);
  EXPECT_EQ(d.config().draft_vocab, s.drafter.config().draft_vocab);
}

// A config that says "no sequential head" (seq_head "none" or no key) while
// the weights hold one is refused, naming the key and the tensor that shows
// the head; with the head's tensors at their untrained values it loads.
TEST(Checkpoint, RefusesADeclaredHeadWeakerThanItsWeights) {
  for (const SeqHead head : {SeqHead::Markov, SeqHead::Gated, SeqHead::Rnn, SeqHead::Elman}) {
    for (const bool erase : {false, true}) {
      SCOPED_TRACE(to_string(head) + (erase ? ", seq_head erased" : ", seq_head none"));
      TempDir tmp;
      const std::string d = tmp.file("drafter");
      save_drafter(tiny_drafter(head, 6), d, false);
      json j = read_json(d);
      if (erase) j["config"].erase("seq_head");
      else j["config"]["seq_head"] = "none";
      write_json(d, j);
      const std::string m = message_of<FormatError>([&] { load_drafter(d); });
      EXPECT_MENTIONS(m, "dspark.json");
      EXPECT_MENTIONS(m, erase ? "no \"seq_head\" key" : "\"seq_head\": \"none\"");
      EXPECT_MENTIONS(m, "Set config.seq_head to \"" + to_string(head) + "\"");
      const char* evidence = head == SeqHead::Markov ? "non-zero markov_w2.weight"
                             : head == SeqHead::Gated ? "markov_gate."
                             : head == SeqHead::Rnn   ? "rnn."
                                                      : "elman.";
      EXPECT_MENTIONS(m, evidence);
    }
  }
  // A Markov drafter whose projection is still zero drafts exactly like one
  // without a head: "none" (or no key) loads.
  TempDir tmp;
  const std::string d = tmp.file("drafter");
  Drafter fresh = tiny_drafter(SeqHead::Markov, 6);
  fresh.mutable_params().at("markov_w2.weight").zero_();
  save_drafter(fresh, d, false);
  json j = read_json(d);
  j["config"].erase("seq_head");
  write_json(d, j);
  EXPECT_EQ(load_drafter(d).config().seq_head, SeqHead::None);
}

// The same on damaged copies of the shipped SmolLM2 drafter, as a user
// would make them by editing its dspark.json.
TEST(Checkpoint, DamagedCopiesOfTheShippedDrafterAreRefused) {
  const std::string shipped = DSPARK_SOURCE_DIR "/drafters/smollm2";
  if (!fs::exists(shipped + "/model.safetensors")) GTEST_SKIP() << "no shipped drafter at " << shipped;
  TempDir tmp;
  const std::string d = tmp.file("smollm2");
  fs::create_directories(d);
  for (const char* f : {"dspark.json", "model.safetensors"}) fs::copy_file(shipped + "/" + f, d + "/" + f);
  const json original = read_json(d);
  ASSERT_EQ(original["config"]["seq_head"], "markov");
  const Drafter ok = load_drafter(d);
  EXPECT_EQ(ok.config().seq_head, SeqHead::Markov);
  const int gamma = ok.config().gamma;
  struct Case {
    const char* what;
    std::function<void(json&)> edit;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {"seq_head deleted", [](json& j) { j["config"].erase("seq_head"); },
       {"no \"seq_head\" key", "non-zero markov_w2.weight", "Set config.seq_head to \"markov\""}},
      {"seq_head none", [](json& j) { j["config"]["seq_head"] = "none"; },
       {"\"seq_head\": \"none\"", "non-zero markov_w2.weight", "Set config.seq_head to \"markov\""}},
      {"gamma 7.5", [&](json& j) { j["config"]["gamma"] = gamma + 0.5; }, {"'gamma'", "must be an integer"}},
      {"a draft-vocabulary id 17.5", [](json& j) { j["config"]["draft_vocab"][3] = 17.5; },
       {"'draft_vocab' element 3", "must be an integer", "17.5"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    json j = original;
    c.edit(j);
    write_json(d, j);
    const std::string m = message_of<FormatError>([&] { load_drafter(d); });
    EXPECT_MENTIONS(m, "dspark.json");
    for (const auto& part : c.parts) EXPECT_MENTIONS(m, part);
  }
}

TEST(Checkpoint, RefusesMissingDirectory) {
  TempDir tmp;
  const std::string missing = tmp.file("no-such-drafter");
  std::string m = message_of<Error>([&] { load_drafter(missing); });
  EXPECT_MENTIONS(m, missing);
  EXPECT_MENTIONS(m, "does not exist");
  // A directory without dspark.json.
  fs::create_directories(tmp.file("empty"));
  m = message_of<Error>([&] { load_drafter(tmp.file("empty")); });
  EXPECT_MENTIONS(m, "dspark.json");
}

// ---- legacy dflash directories ---------------------------------------------------------

TEST(Checkpoint, LegacyDflashLoadsAndDecodesLosslessly) {
  DSPARK_REAL_MODEL(lm);
  TargetModel& target = *lm.target;
  TempDir tmp;
  const std::string d = tmp.file("dflash");
  fs::create_directories(d);
  // A DFlash drafter as older tools wrote it: backbone tensors only, no
  // seq_head in the config, no Markov or confidence tensors.
  const DrafterConfig cfg = spectest::small_config(target.info(), SeqHead::None, 5);
  const Drafter src = spectest::perturbed_drafter(cfg, 31);
  std::map<std::string, at::Tensor> backbone;
  for (const auto& [name, t] : src.params())
    if (name.rfind("markov_", 0) != 0 && name.rfind("conf_proj", 0) != 0) backbone[name] = t.to(at::kBFloat16);
  ASSERT_EQ(backbone.size() + 4, src.params().size());
  std::vector<std::pair<std::string, at::Tensor>> tensors(backbone.begin(), backbone.end());
  io::save_safetensors(d + "/model.safetensors", tensors);
  json config = config_to_json(cfg);
  config.erase("seq_head");
  write_json(d, {{"kind", "dspark-drafter"},
                 {"variant", "dflash"},
                 {"version", 1},
                 {"target_id", cfg.target_id},
                 {"config", config},
                 {"dims", {{"hidden_size", cfg.hidden}, {"vocab_size", cfg.vocab}, {"eps", cfg.eps}}}});

  Drafter got = load_drafter(d);
  EXPECT_EQ(got.config().seq_head, SeqHead::None);
  for (const auto& [name, t] : backbone)
    EXPECT_TRUE(at::equal(got.params().at(name), t.to(at::kFloat))) << name;
  EXPECT_EQ(got.params().at("markov_w2.weight").abs().max().item<float>(), 0.f);
  EXPECT_EQ(got.params().at("conf_proj.bias").abs().max().item<float>(), 0.f);

  check_drafter_matches(got.config(), target.info());
  got.bind(target);
  for (size_t p : {size_t{6}, size_t{21}}) {
    const GenerateResult& plain = spectest::plain_greedy(p, 24, lm.stop_ids);
    SpecOptions so;
    so.gamma = 5;
    so.prune = false;
    const GenerateResult spec =
        generate_speculative(target, got, spectest::dev_prompt_ids(p), spectest::greedy_options(24, lm.stop_ids), so);
    EXPECT_EQ(spectest::compare_runs(plain, spec), "") << "prompt " << p;
  }
}

// ---- saves that fail part-way ------------------------------------------------------------

// Caps the size of files this process writes (RLIMIT_FSIZE, SIGXFSZ ignored so
// that an oversized write fails with EFBIG instead of killing the process).
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    getrlimit(RLIMIT_FSIZE, &old_);
    old_handler_ = std::signal(SIGXFSZ, SIG_IGN);
    rlimit lim = old_;
    lim.rlim_cur = bytes;
    ok_ = setrlimit(RLIMIT_FSIZE, &lim) == 0;
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &old_);
    std::signal(SIGXFSZ, old_handler_);
  }
  bool ok() const { return ok_; }

 private:
  rlimit old_{};
  void (*old_handler_)(int) = SIG_DFL;
  bool ok_ = false;
};

std::vector<std::string> leftovers(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n != "model.safetensors" && n != "dspark.json") out.push_back(n);
  }
  return out;
}

TEST(CheckpointAtomic, FailedWeightsWriteKeepsPrevious) {
  TempDir tmp;
  const std::string d = tmp.file("drafter");
  const Drafter a = tiny_drafter(SeqHead::Elman, 1);
  save_drafter(a, d, false);
  const std::string json_before = test::read_bytes(d + "/dspark.json");
  {
    FileSizeLimit limit(4096);  // far below the weights' size
    ASSERT_TRUE(limit.ok());
    EXPECT_THROW(save_drafter(tiny_drafter(SeqHead::Elman, 2), d, false), Error);
  }
  EXPECT_EQ(test::read_bytes(d + "/dspark.json"), json_before);
  const Drafter got = load_drafter(d);
  EXPECT_EQ(param_mismatch(got.params(), a.params()), "");
  EXPECT_TRUE(leftovers(d).empty()) << leftovers(d).front();
}

TEST(CheckpointAtomic, FailedConfigWriteKeepsPrevious) {
  // The weights are written (and renamed into place) first; here the
  // dspark.json that follows fails to write. The previous checkpoint must
  // still load as it was: neither refused nor paired with the new weights.
  TempDir tmp;
  const std::string d = tmp.file("drafter");
  const Drafter a = tiny_drafter(SeqHead::Markov, 1);
  save_drafter(a, d, false);
  const int64_t weights = static_cast<int64_t>(fs::file_size(d + "/model.safetensors"));
  for (bool same_size : {true, false}) {
    SCOPED_TRACE(same_size ? "same weights size" : "different weights size");
    {
      FileSizeLimit limit(static_cast<rlim_t>(weights) + (1 << 20));
      ASSERT_TRUE(limit.ok());
      // A dspark.json larger than the limit (a large extra key) cannot be written.
      const json extra = {{"padding", std::string(static_cast<size_t>(weights) + (2 << 20), 'x')}};
      EXPECT_THROW(save_drafter(tiny_drafter(SeqHead::Markov, 2), d, /*bf16=*/!same_size, extra), Error);
    }
    try {
      const Drafter got = load_drafter(d);
      EXPECT_EQ(param_mismatch(got.params(), a.params()), "")
          << "the previous dspark.json now loads with other weights";
    } catch (const Error& e) {
      ADD_FAILURE() << "the previous checkpoint no longer loads: " << e.what();
    }
    save_drafter(a, d, false);  // restore for the next case
  }
}

TEST(CheckpointAtomic, SaveUnderAFileFails) {
  TempDir tmp;
  test::write_bytes(tmp.file("plain-file"), "not a directory");
  const std::string d = tmp.file("plain-file/drafter");
  EXPECT_THROW(save_drafter(tiny_drafter(SeqHead::None), d), Error);
  EXPECT_EQ(test::read_bytes(tmp.file("plain-file")), "not a directory");
}

}  // namespace
