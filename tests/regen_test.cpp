// Self-distillation regeneration on the real SmolLM2 model: batched decoding
// equals one-at-a-time decoding, the assistant mask, resumption, the
// supervised-token filter and prompts-file errors.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dspark/error.hpp"
#include "dspark/io/safetensors.hpp"
#include "dspark/model/loaded_model.hpp"
#include "dspark/speculative/generate.hpp"
#include "dspark/train/regen.hpp"
#include "test_util.hpp"

namespace dspark {
namespace {

namespace fs = std::filesystem;
using train::PromptEntry;

const std::vector<PromptEntry>& test_prompts() {
  static const std::vector<PromptEntry> p = {
      {"p0", "chat", "Name three colors of the rainbow."},
      {"p1", "math", "What is 12 times 7?"},
      {"p2", "code", "Write a Python function that adds two numbers."},
      {"p3", "instruct", "Write one sentence about the sea."},
      {"p4", "chat", "Say hello in French."},
      {"p5", "chat", "Why do cats purr?"},
      {"p6", "instruct", "List two uses of a paperclip."},
  };
  return p;
}

class RegenTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (test::model_available()) model_ = std::make_unique<LoadedModel>(LoadedModel::load(test::model_path()));
  }
  static void TearDownTestSuite() { model_.reset(); }
  void SetUp() override { DSPARK_REQUIRE_MODEL(); }

  static train::RegenOptions options(int64_t n_predict, float temperature) {
    train::RegenOptions o;
    o.n_predict = n_predict;
    o.batch = 3;
    o.shard_sequences = 2;
    o.min_supervised = 0;
    o.sampling.temperature = temperature;
    o.sampling.seed = 1234;
    return o;
  }

  static std::unique_ptr<LoadedModel> model_;
};
std::unique_ptr<LoadedModel> RegenTest::model_;

// Batched decoding (refills included: 7 sequences through 3 slots) gives each
// sequence exactly what generate_plain gives it alone, greedy and sampled.
TEST_F(RegenTest, BatchedMatchesPlainTokenForToken) {
  const auto& prompts = test_prompts();
  for (const float temp : {0.0f, 0.7f}) {
    SCOPED_TRACE(temp);
    GenerateOptions gen;
    gen.n_predict = 20;
    gen.stop_ids = model_->stop_ids;
    gen.sampling = SamplingParams{temp, 20, 0.8f, 0.0f, 0};
    std::vector<train::BatchRequest> reqs;
    for (size_t i = 0; i < prompts.size(); ++i)
      reqs.push_back({model_->encode_prompt(prompts[i].text, true), 99 + i});
    std::vector<train::BatchResult> got(prompts.size());
    int64_t calls = 0, sampled = 0;
    train::generate_batched(
        *model_->target, reqs, gen, 3,
        [&](train::BatchResult&& r) {
          got[r.index] = std::move(r);
          return true;
        },
        [&](int64_t n) {
          ++calls;
          sampled += n;
          EXPECT_LE(n, 3);
          return true;
        });
    int64_t total = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      SCOPED_TRACE(prompts[i].id);
      GenerateOptions one = gen;
      one.sampling.seed = 99 + i;
      const GenerateResult ref = generate_plain(*model_->target, reqs[i].prompt, one);
      std::vector<TokenId> expect = ref.tokens;
      EXPECT_EQ(got[i].stopped_by_eog, ref.stopped_by_eog);
      if (got[i].stopped_by_eog) {
        ASSERT_FALSE(got[i].response.empty());
        EXPECT_NE(std::find(gen.stop_ids.begin(), gen.stop_ids.end(), got[i].response.back()),
                  gen.stop_ids.end());
        expect.push_back(got[i].response.back());
      }
      EXPECT_EQ(got[i].response, expect);
      total += static_cast<int64_t>(got[i].response.size());
    }
    EXPECT_EQ(sampled, total);
    EXPECT_LT(calls, total);  // several sequences shared each call
  }
}

// Stored sequences are the chat-wrapped prompt followed by the response, the
// mask is 0 on the prompt and 1 on every response token (the end-of-turn
// included), in prompt order, with the manifest totals matching the shards.
TEST_F(RegenTest, MaskCoversExactlyTheResponse) {
  test::TempDir dir;
  const auto& prompts = test_prompts();
  auto opts = options(18, 0.0f);
  opts.limit = 5;
  opts.save_text = true;
  const auto s = train::regenerate(*model_, prompts, dir.path().string(), opts);
  EXPECT_TRUE(s.complete);
  EXPECT_EQ(s.n_sequences, 5);
  EXPECT_EQ(s.shards, 3);  // 2 + 2 + 1

  const auto seqs = train::read_regen_dir(dir.path().string());
  ASSERT_EQ(seqs.size(), 5u);
  int64_t n_tok = 0, n_sup = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(seqs[i].prompt_id, prompts[i].id);
    const auto prompt = model_->encode_prompt(prompts[i].text, true);
    GenerateOptions gen;
    gen.n_predict = 18;
    gen.stop_ids = model_->stop_ids;
    gen.sampling.temperature = 0;
    const auto ref = generate_plain(*model_->target, prompt, gen);
    std::vector<TokenId> expect = prompt;
    expect.insert(expect.end(), ref.tokens.begin(), ref.tokens.end());
    if (ref.stopped_by_eog) expect.push_back(model_->chat->end_of_turn());
    EXPECT_EQ(seqs[i].tokens, expect);
    ASSERT_EQ(seqs[i].loss_mask.size(), expect.size());
    for (size_t t = 0; t < expect.size(); ++t) EXPECT_EQ(seqs[i].loss_mask[t], t < prompt.size() ? 0 : 1) << t;
    n_tok += static_cast<int64_t>(expect.size());
    n_sup += static_cast<int64_t>(expect.size() - prompt.size());
  }
  EXPECT_EQ(s.n_tokens, n_tok);
  EXPECT_EQ(s.n_supervised, n_sup);

  const auto m = nlohmann::json::parse(test::read_bytes(dir.file("manifest.json")));
  EXPECT_EQ(m["format"], train::kRegenFormat);
  EXPECT_EQ(m["target_id"], model_->target->info().id);
  EXPECT_EQ(m["n_sequences"], 5);
  EXPECT_EQ(m["sampling"]["seed"], 1234);
  ASSERT_EQ(m["shards"].size(), 3u);
  EXPECT_EQ(m["shards"][0]["file"], "data-00000.safetensors");

  const auto shard = io::load_safetensors(dir.file("data-00000.safetensors"));
  EXPECT_EQ(shard.tensors.at("tokens").scalar_type(), at::kInt);
  EXPECT_EQ(shard.tensors.at("offsets").scalar_type(), at::kLong);
  EXPECT_EQ(shard.tensors.at("loss_mask").scalar_type(), at::kByte);
  EXPECT_EQ(nlohmann::json::parse(shard.metadata.at("prompt_ids")), nlohmann::json({"p0", "p1"}));
  const auto texts = nlohmann::json::parse(shard.metadata.at("responses"));
  ASSERT_EQ(texts.size(), 2u);
  EXPECT_FALSE(texts[0].get<std::string>().empty());
}

// An interrupted run (stopped after a shard, and again mid-shard) plus a
// crash leftover, then resumed, writes byte-identical shards and manifest.
TEST_F(RegenTest, ResumeEqualsUninterruptedRun) {
  test::TempDir a, b;
  const auto& prompts = test_prompts();
  auto opts = options(16, 0.7f);
  const auto full = train::regenerate(*model_, prompts, a.path().string(), opts);
  ASSERT_TRUE(full.complete);
  ASSERT_EQ(full.shards, 4);

  auto first = opts;
  first.on_progress = [](const train::RegenProgress& p) { return !(p.shard_written && p.shards == 1); };
  const auto s1 = train::regenerate(*model_, prompts, b.path().string(), first);
  EXPECT_FALSE(s1.complete);
  EXPECT_EQ(s1.shards, 1);

  int steps_after = -1;  // forward steps since the second shard was written
  auto second = opts;
  second.on_progress = [&](const train::RegenProgress& p) {
    if (p.shard_written) {
      if (p.shards == 2) steps_after = 0;
      return true;
    }
    return !(steps_after >= 0 && ++steps_after >= 2);  // stop inside the third shard
  };
  const auto s2 = train::regenerate(*model_, prompts, b.path().string(), second);
  EXPECT_FALSE(s2.complete);
  EXPECT_EQ(s2.skipped_existing, 2);
  EXPECT_EQ(s2.shards, 2);
  EXPECT_EQ(steps_after, 2);  // generated tokens were lost with the interruption

  // What a crash between a shard write and the manifest update leaves behind.
  test::write_bytes(b.file("data-00003.safetensors"), "stale");
  test::write_bytes(b.file("data-00002.safetensors.tmp.1.0"), "partial");
  const auto s3 = train::regenerate(*model_, prompts, b.path().string(), opts);
  EXPECT_TRUE(s3.complete);
  EXPECT_EQ(s3.skipped_existing, 4);

  for (const auto& entry : fs::directory_iterator(a.path())) {
    const std::string name = entry.path().filename().string();
    if (name == ".lock") continue;
    SCOPED_TRACE(name);
    ASSERT_TRUE(fs::exists(b.file(name)));
    EXPECT_EQ(test::read_bytes(a.file(name)), test::read_bytes(b.file(name)));
  }
  size_t files_b = 0;
  for (const auto& entry : fs::directory_iterator(b.path())) files_b += entry.path().filename() != ".lock";
  EXPECT_EQ(files_b, 5u);  // manifest + 4 shards, the leftovers removed

  // Other settings than the directory's are refused.
  auto other = opts;
  other.sampling.seed = 7;
  try {
    train::regenerate(*model_, prompts, b.path().string(), other);
    FAIL() << "expected dspark::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("seed"), std::string::npos) << e.what();
  }
  // So is another prompts file: its prompts are not those stored.
  std::vector<PromptEntry> renamed = prompts;
  for (auto& p : renamed) p.id = "other-" + p.id;
  auto elsewhere = opts;
  elsewhere.prompts_file = "other-prompts.jsonl";
  try {
    train::regenerate(*model_, renamed, b.path().string(), elsewhere);
    FAIL() << "expected dspark::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not in other-prompts.jsonl (e.g. 'p"), std::string::npos) << e.what();
  }
}

// Responses with fewer than min_supervised tokens are dropped, recorded as
// such, and not regenerated on a resume.
TEST_F(RegenTest, DropsSamplesWithFewSupervisedTokens) {
  const auto& prompts = test_prompts();
  {
    test::TempDir dir;
    auto opts = options(13, 0.0f);  // at most 13 response tokens
    opts.min_supervised = 14;
    opts.limit = 4;
    const auto s = train::regenerate(*model_, prompts, dir.path().string(), opts);
    EXPECT_TRUE(s.complete);
    EXPECT_EQ(s.n_sequences, 0);
    EXPECT_EQ(s.n_dropped, 4);
    EXPECT_TRUE(train::read_regen_dir(dir.path().string()).empty());
    const auto again = train::regenerate(*model_, prompts, dir.path().string(), opts);
    EXPECT_EQ(again.skipped_existing, 4);
    EXPECT_EQ(again.generated_tokens, 0);
  }
  {
    // Prompts that do not fit the context are dropped without generating.
    test::TempDir dir;
    auto opts = options(8, 0.0f);
    opts.ctx_size = 12;  // shorter than every chat-wrapped prompt
    opts.limit = 3;
    const auto s = train::regenerate(*model_, prompts, dir.path().string(), opts);
    EXPECT_TRUE(s.complete);
    EXPECT_EQ(s.n_dropped, 3);
    EXPECT_EQ(s.generated_tokens, 0);
    const auto shard = io::load_safetensors(dir.file("data-00000.safetensors"));
    EXPECT_EQ(nlohmann::json::parse(shard.metadata.at("dropped_ids")), nlohmann::json({"p0", "p1", "p2"}));
    const auto m = nlohmann::json::parse(test::read_bytes(dir.file("manifest.json")));
    EXPECT_EQ(m["sampling"]["ctx_size"], 12);
  }
  test::TempDir dir;
  auto opts = options(24, 0.0f);
  opts.min_supervised = 14;
  const auto s = train::regenerate(*model_, prompts, dir.path().string(), opts);
  const auto seqs = train::read_regen_dir(dir.path().string());
  EXPECT_EQ(s.n_sequences + s.n_dropped, static_cast<int64_t>(prompts.size()));
  EXPECT_EQ(s.n_sequences, static_cast<int64_t>(seqs.size()));
  for (const auto& q : seqs) {
    int64_t sup = 0;
    for (uint8_t m : q.loss_mask) sup += m;
    EXPECT_GE(sup, 14) << q.prompt_id;
  }
}

TEST(RegenPromptsFile, BadFilesGiveClearErrors) {
  test::TempDir dir;
  auto expect_error = [&](const std::string& body, const std::string& needle) {
    const std::string path = dir.file("p.jsonl");
    test::write_bytes(path, body);
    try {
      train::read_prompts_jsonl(path);
      ADD_FAILURE() << "expected FormatError for: " << body;
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error("{\"id\":\"a\",\"prompt\":\"x\"}\nnot json\n", "p.jsonl:2: not valid JSON");
  expect_error("{\"id\":\"a\",\"text\":\"x\"}\n", "p.jsonl:1: expected a string \"prompt\"");
  expect_error("[1,2]\n", "expected a JSON object");
  expect_error("{\"id\":3,\"prompt\":\"x\"}\n", "\"id\" must be a string");
  expect_error("{\"id\":\"a\",\"prompt\":\"\"}\n", "\"prompt\" is empty");
  expect_error("{\"id\":\"a\",\"prompt\":\"x\"}\n\n{\"id\":\"a\",\"prompt\":\"y\"}\n", "p.jsonl:3: id 'a' repeats");
  expect_error("\n  \n", "p.jsonl: no prompts");
  EXPECT_THROW(train::read_prompts_jsonl(dir.file("missing.jsonl")), Error);

  test::write_bytes(dir.file("ok.jsonl"), "{\"prompt\":\"hi\"}\n{\"id\":\"b\",\"kind\":\"chat\",\"prompt\":\"yo\"}\n");
  const auto p = train::read_prompts_jsonl(dir.file("ok.jsonl"));
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].id, "line-1");
  EXPECT_EQ(p[1].kind, "chat");

  // The command reports the problem and exits with status 2 before loading a model.
  test::write_bytes(dir.file("bad.jsonl"), "{\"prompt\": 5}\n");
  const std::string cmd = std::string(DSPARK_BINARY) + " regen -m /nonexistent.gguf --prompts " +
                          dir.file("bad.jsonl") + " --out " + dir.file("out") + " 2>" + dir.file("err");
  const int rc = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(rc));
  EXPECT_EQ(WEXITSTATUS(rc), 2);
  EXPECT_NE(test::read_bytes(dir.file("err")).find("bad.jsonl:1: expected a string \"prompt\""), std::string::npos)
      << test::read_bytes(dir.file("err"));
}

// The manifest records the prompts file's absolute path: export-data finds it
// from any working directory, and says where the path came from when the
// file is gone.
TEST(RegenCli, ManifestNamesThePromptsFileFromAnyDirectory) {
  DSPARK_REQUIRE_MODEL();
  test::TempDir dir;
  test::write_bytes(dir.file("p.jsonl"), "{\"id\":\"a\",\"prompt\":\"Say hi.\"}\n");
  const std::string bin = DSPARK_BINARY;
  const auto run = [&](const std::string& cwd, const std::string& args) {
    const std::string cmd = "cd " + cwd + " && " + bin + " " + args + " >" + dir.file("log") + " 2>&1";
    const int rc = std::system(cmd.c_str());
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  };
  ASSERT_EQ(run(dir.path().string(), "regen -m " + test::model_path() +
                                         " --prompts p.jsonl --out data -n 4 --min-supervised 1"),
            0)
      << test::read_bytes(dir.file("log"));
  const auto manifest = nlohmann::json::parse(test::read_bytes(dir.file("data/manifest.json")));
  EXPECT_EQ(manifest["prompts_file"], dir.file("p.jsonl"));
  EXPECT_EQ(run("/", "export-data -m " + test::model_path() + " --data " + dir.file("data") + " -o " +
                         dir.file("x.jsonl")),
            0)
      << test::read_bytes(dir.file("log"));
  fs::rename(dir.file("p.jsonl"), dir.file("moved.jsonl"));
  EXPECT_EQ(run("/", "export-data -m " + test::model_path() + " --data " + dir.file("data") + " -o " +
                         dir.file("y.jsonl")),
            2);
  const std::string log = test::read_bytes(dir.file("log"));
  EXPECT_NE(log.find("(the prompts_file that " + dir.file("data") + "/manifest.json names) does not exist"),
            std::string::npos)
      << log;
}

}  // namespace
}  // namespace dspark
