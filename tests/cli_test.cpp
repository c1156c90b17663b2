// End-to-end tests of the `dspark` command: real prompts on the real model,
// and every kind of bad input gets one clear line and exit status 2.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "test_util.hpp"

namespace dspark::test {
namespace {

struct RunResult {
  int status = -1;
  std::string out, err;
};

// Runs the dspark binary with `args` (a shell-quoted string) after `env`
// ("NAME=value " assignments); captures stdout and stderr separately.
RunResult run_dspark(const std::string& args, const TempDir& tmp, const std::string& env = "") {
  const std::string out = (tmp.path() / "stdout").string(), err = (tmp.path() / "stderr").string();
  const std::string cmd = env + std::string(DSPARK_BINARY) + " " + args + " >" + out + " 2>" + err;
  RunResult r;
  const int rc = std::system(cmd.c_str());
  r.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  r.out = read_bytes(out);
  r.err = read_bytes(err);
  return r;
}

// The error output is exactly one line starting with "error: ".
void expect_one_line_error(const RunResult& r, const std::string& needle) {
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << "expected '" << needle << "' in: " << r.err;
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override { DSPARK_REQUIRE_MODEL(); }
  TempDir tmp;
};

TEST_F(Cli, GenerateGreedyChatJson) {
  // (A prompt whose first token is no near-tie: "What is the capital of
  // France?" starts with "The" and "L" within 0.2 logits of each other.)
  auto r = run_dspark("generate -m smollm2 --chat --temp 0 -n 16 --drafter none --json -p "
                      "'Name the capital city of France.'",
                      tmp);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("text").get<std::string>().rfind("The capital city of France is Paris", 0), 0u)
      << j.at("text");
  EXPECT_FALSE(j.at("tokens").empty());
  const auto& s = j.at("stats");
  for (const char* k : {"prompt_tokens", "generated_tokens", "prefill_tok_s", "decode_tok_s"})
    EXPECT_TRUE(s.contains(k)) << k;
  EXPECT_EQ(s.at("generated_tokens").get<size_t>(), j.at("tokens").size());
  EXPECT_GT(s.at("decode_tok_s").get<double>(), 0.0);
}

TEST_F(Cli, StreamedTextEqualsJsonText) {
  const std::string common = "generate -m smollm2 --chat --temp 0 -n 24 --drafter none -p 'Name three colors.'";
  auto streamed = run_dspark(common, tmp);
  ASSERT_EQ(streamed.status, 0) << streamed.err;
  auto js = run_dspark(common + " --json", tmp);
  ASSERT_EQ(js.status, 0) << js.err;
  EXPECT_EQ(streamed.out, nlohmann::json::parse(js.out).at("text").get<std::string>() + "\n");
  EXPECT_NE(streamed.err.find("decode:"), std::string::npos) << streamed.err;
}

TEST_F(Cli, SamplingIsReproducibleForASeed) {
  const std::string a = "generate -m smollm2 --chat --temp 0.9 --top-k 40 --top-p 0.95 -n 16 "
                        "--drafter none --json -p 'Tell me a story.' --seed ";
  auto r1 = run_dspark(a + "7", tmp), r2 = run_dspark(a + "7", tmp);
  ASSERT_EQ(r1.status, 0) << r1.err;
  EXPECT_EQ(nlohmann::json::parse(r1.out).at("tokens"), nlohmann::json::parse(r2.out).at("tokens"));
}

TEST_F(Cli, SpeculativeWithRandomDrafterIsLossless) {
  const std::string dir = (tmp.path() / "drafter").string();
  auto init = run_dspark("init-drafter -m smollm2 --out " + dir + " --head markov --gamma 4", tmp);
  ASSERT_EQ(init.status, 0) << init.err;
  const std::string base = "generate -m smollm2 --chat --temp 0 -n 24 --json -p 'List two fruits.' --drafter ";
  auto plain = run_dspark(base + "none", tmp);
  auto spec = run_dspark(base + dir, tmp);
  ASSERT_EQ(spec.status, 0) << spec.err;
  const auto p = nlohmann::json::parse(plain.out), s = nlohmann::json::parse(spec.out);
  EXPECT_EQ(p.at("tokens"), s.at("tokens"));
  for (const char* k : {"tau", "target_calls", "drafted", "accepted", "acceptance_by_position",
                        "draft_ms", "verify_ms"})
    EXPECT_TRUE(s.at("stats").contains(k)) << k;
}

TEST_F(Cli, BenchReportsLosslessAggregate) {
  const std::string dir = (tmp.path() / "drafter").string();
  ASSERT_EQ(run_dspark("init-drafter -m smollm2 --out " + dir + " --gamma 3", tmp).status, 0);
  auto r = run_dspark("bench -m smollm2 --drafter " + dir + " --prompts " DSPARK_SOURCE_DIR
                      "/data/dev-prompts.jsonl --limit 2 -n 12 --temp 0 --json",
                      tmp);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const auto& a = j.at("aggregate");
  for (const char* k : {"tau", "plain_tok_s", "spec_tok_s", "speedup", "acceptance_by_position"})
    EXPECT_TRUE(a.contains(k)) << k;
  EXPECT_TRUE(a.at("lossless").get<bool>());
  ASSERT_EQ(j.at("prompts").size(), 2u);
  EXPECT_TRUE(j.at("prompts")[0].at("lossless").get<bool>());
  // One run: each aggregate rate is total tokens over total time, so it lies
  // between the prompts' own rates (each counts the tokens after the first).
  for (const char* k : {"plain_tok_s", "spec_tok_s"}) {
    const double p0 = j.at("prompts")[0].at(k).get<double>(), p1 = j.at("prompts")[1].at(k).get<double>();
    const double agg = a.at(k).get<double>();
    EXPECT_GE(agg, std::min(p0, p1) * (1 - 1e-9)) << k;
    EXPECT_LE(agg, std::max(p0, p1) * (1 + 1e-9)) << k;
  }
}

// Gemma 3 (a base model: prompts as completions) with a random drafter, on a
// short completion prompt and one longer than its 512-token sliding window.
TEST_F(Cli, GemmaBenchIsLosslessPastTheSlidingWindow) {
  DSPARK_REQUIRE_GEMMA();
  const std::string dir = (tmp.path() / "drafter").string();
  auto init = run_dspark("init-drafter -m gemma3 --out " + dir + " --gamma 4", tmp);
  ASSERT_EQ(init.status, 0) << init.err;
  std::ifstream in(DSPARK_SOURCE_DIR "/data/completion-prompts.jsonl");
  const std::string prompts = (tmp.path() / "prompts.jsonl").string();
  std::ofstream out(prompts);
  int kept = 0;
  for (std::string line; std::getline(in, line);) {
    const auto id = nlohmann::json::parse(line).at("id").get<std::string>();
    if (id == "cmp-000" || id == "cmp-long-003") out << line << '\n', ++kept;
  }
  out.close();
  ASSERT_EQ(kept, 2);
  auto r = run_dspark("bench -m gemma3 --drafter " + dir + " --prompts " + prompts + " -n 16 --temp 0 --json", tmp);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j.at("aggregate").at("lossless").get<bool>());
  ASSERT_EQ(j.at("prompts").size(), 2u);
  for (const auto& p : j.at("prompts")) EXPECT_TRUE(p.at("lossless").get<bool>()) << p.dump();
}

// The shipped Gemma 3 drafter is what `-m gemma3` decodes with by default:
// greedy output equals plain decoding, and its drafts are accepted (every
// position verified, on held-out completion prompts).
TEST_F(Cli, ShippedGemmaDrafterIsFoundAndLossless) {
  DSPARK_REQUIRE_GEMMA();
  if (!std::filesystem::exists(DSPARK_SOURCE_DIR "/drafters/gemma3/model.safetensors"))
    GTEST_SKIP() << "no drafters/gemma3 in this checkout";
  const std::string base = "generate -m gemma3 --temp 0 -n 40 --json -p 'The licence grants every user the right to' ";
  auto plain = run_dspark(base + "--drafter none", tmp);
  auto spec = run_dspark(base + "--schedule off --lookup-ngram 0", tmp);  // --drafter auto
  ASSERT_EQ(plain.status, 0) << plain.err;
  ASSERT_EQ(spec.status, 0) << spec.err;
  const auto p = nlohmann::json::parse(plain.out), s = nlohmann::json::parse(spec.out);
  EXPECT_EQ(p.at("tokens"), s.at("tokens"));
  EXPECT_GT(s.at("stats").at("drafted").get<int64_t>(), 0) << "no drafter ran: " << spec.err;
  EXPECT_GT(s.at("stats").at("accepted").get<int64_t>(), 0) << s.at("stats").dump();
}

// ---- bad input ---------------------------------------------------------------

TEST_F(Cli, MissingModelFile) {
  expect_one_line_error(run_dspark("generate -m /nonexistent/model.gguf -p hi", tmp),
                        "model '/nonexistent/model.gguf': no such file, and not a model alias (gemma3, smollm2)");
  expect_one_line_error(run_dspark("generate -m smolm2 -p hi", tmp),
                        "model 'smolm2': no such file, and not a model alias (gemma3, smollm2)");
}

TEST_F(Cli, NotAGgufFile) {
  const auto path = tmp.path() / "notes.gguf";
  write_bytes(path.string(), "this is plain text, not a model\n");
  expect_one_line_error(run_dspark("generate -m " + path.string() + " -p hi", tmp), "not a GGUF file");
}

TEST_F(Cli, TruncatedGguf) {
  const auto path = tmp.path() / "cut.gguf";
  std::ifstream in(model_path(), std::ios::binary);
  std::string head(4 << 20, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  write_bytes(path.string(), head);
  expect_one_line_error(run_dspark("generate -m " + path.string() + " -p hi", tmp), "truncated");
}

TEST_F(Cli, UnsupportedArchitecture) {
  auto w = tiny_llama_writer(1);
  w.set("general.architecture", io::gguf::string("mamba"));
  const auto path = tmp.path() / "mamba.gguf";
  w.write(path.string());
  expect_one_line_error(run_dspark("generate -m " + path.string() + " -p hi", tmp),
                        "unsupported architecture 'mamba'");
}

TEST_F(Cli, UnsupportedQuantType) {
  TinyLlamaOptions o;
  o.hidden = 256;
  o.n_heads = 4;
  o.n_kv_heads = 2;
  o.ffn = 256;
  o.tensor_types["blk.0.ffn_up.weight"] = io::GGMLType::Q5_K;
  const auto path = tmp.path() / "q5k.gguf";
  write_tiny_llama(path.string(), 2, o);
  expect_one_line_error(run_dspark("generate -m " + path.string() + " -p hi", tmp), "Q5_K");
}

TEST_F(Cli, PromptLongerThanContext) {
  std::string long_prompt;
  for (int i = 0; i < 60; ++i) long_prompt += "word ";
  expect_one_line_error(run_dspark("generate -m smollm2 -c 32 -p '" + long_prompt + "'", tmp),
                        "prompt too long");
  // One token in a context of one: what is needed is said in numbers.
  expect_one_line_error(run_dspark("generate -m smollm2 -c 1 -p hi", tmp),
                        "prompt too long: 1 token and a context of 1; the context holds the prompt and at least one "
                        "generated token, so it needs at least 2 (or a shorter prompt)");
  // Longer than the model's 8,192-token context: no -c can hold it, so the
  // message gives the longest prompt allowed instead.
  const auto path = tmp.path() / "long.txt";
  {
    std::ofstream f(path);
    for (int i = 0; i < 9000; ++i) f << "word ";
  }
  expect_one_line_error(run_dspark("generate -m smollm2 -f " + path.string(), tmp),
                        "and the model's context is 8192 tokens, so the prompt must be at most 8191 tokens");
}

TEST_F(Cli, DraftVocabLargerThanTheVocabularyIsRefused) {
  const auto dir = tmp.path() / "drafter";
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(DSPARK_SOURCE_DIR "/drafters/smollm2/dspark.json", dir / "dspark.json");
  expect_one_line_error(
      run_dspark("draft-vocab -m smollm2 --data " + (tmp.path() / "none").string() + " --drafter " + dir.string() +
                     " -n 10000000 --dry-run",
                 tmp),
      "--size 10000000 is more than the model's vocabulary of 49152 tokens (0: draft on the whole vocabulary)");
  expect_one_line_error(run_dspark("train -m smollm2 --data " + (tmp.path() / "none").string() + " --out " +
                                       (tmp.path() / "run").string() + " --draft-vocab 49153 --steps 1",
                                   tmp),
                        "--draft-vocab 49153 is more than the model's vocabulary of 49152 tokens (0: train on the "
                        "whole vocabulary)");
}

TEST_F(Cli, InvalidSamplingParameters) {
  expect_one_line_error(run_dspark("generate -m smollm2 -p hi --top-p 2", tmp), "top_p must be in (0, 1]");
  expect_one_line_error(run_dspark("generate -m smollm2 -p hi --temp -1", tmp), "temperature");
  expect_one_line_error(run_dspark("generate -m smollm2 -p hi --min-p 1.5", tmp), "min_p");
}

TEST_F(Cli, InvalidThresholdsWithoutDrafter) {
  expect_one_line_error(run_dspark("generate -m smollm2 -p hi -n 2 --drafter none --thresholds 0.5,abc", tmp),
                        "--thresholds: expected numbers in [0, 1]");
}

TEST_F(Cli, EmptyThresholdsAreRefused) {
  expect_one_line_error(run_dspark("generate -m smollm2 -p hi -n 2 --drafter none --thresholds ''", tmp),
                        "--thresholds: expected numbers in [0, 1] separated by commas, or 'none', got an empty string");
}

TEST_F(Cli, LookupDraftsAreLosslessAloneAndWithTheDrafter) {
  // A prompt whose answer repeats itself: lookup drafts fire and are accepted.
  const std::string base = "generate -m smollm2 --chat --temp 0 -n 48 --json -p \"Write a poem where every line "
                           "starts with 'The sea is'.\" ";
  auto plain = run_dspark(base + "--drafter none", tmp);
  ASSERT_EQ(plain.status, 0) << plain.err;
  const auto p = nlohmann::json::parse(plain.out);
  EXPECT_FALSE(p.at("stats").contains("tau")) << "--drafter none is plain decoding unless --lookup-ngram is given";
  for (const std::string extra : {"--drafter none --lookup-ngram 2", "--drafter none --lookup-ngram 1 --lookup-draft-max 5",
                                  "--lookup-ngram 3 --lookup-ngram-max 6", ""}) {
    auto r = run_dspark(base + extra, tmp);
    ASSERT_EQ(r.status, 0) << extra << ": " << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j.at("tokens"), p.at("tokens")) << extra;
    EXPECT_GT(j.at("stats").at("accepted").get<int64_t>(), 0) << extra;
    EXPECT_LT(j.at("stats").at("target_calls").get<int64_t>(), p.at("stats").at("target_calls").get<int64_t>())
        << extra;
  }
}

TEST_F(Cli, InvalidLookupOptionsAreRefused) {
  expect_one_line_error(run_dspark("generate -m smollm2 -p hi -n 2 --lookup-ngram 5 --lookup-ngram-max 3", tmp),
                        "--lookup-ngram-max: expected at least --lookup-ngram = 5, got 3");
  // A shortest n-gram above the default longest (4) raises the longest with it.
  auto ok = run_dspark("generate -m smollm2 -p hi -n 2 --lookup-ngram 6", tmp);
  EXPECT_EQ(ok.status, 0) << ok.err;
  auto r = run_dspark("generate -m smollm2 -p hi -n 2 --lookup-draft-max 0", tmp);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--lookup-draft-max"), std::string::npos) << r.err;
}

TEST_F(Cli, TopKMinusOneMeansOffAsInTheServer) {
  // -1 and 0 both disable top-k (the server's top_k reads them the same way).
  const std::string base = "generate -m smollm2 -p 'Once upon a time' -n 8 --drafter none --temp 1.5 --top-p 1 "
                           "--min-p 0 --seed 5 --json --top-k ";
  auto off = run_dspark(base + "0", tmp);
  ASSERT_EQ(off.status, 0) << off.err;
  auto minus_one = run_dspark(base + "-1", tmp);
  ASSERT_EQ(minus_one.status, 0) << minus_one.err;
  EXPECT_EQ(nlohmann::json::parse(minus_one.out).at("tokens"), nlohmann::json::parse(off.out).at("tokens"));
  expect_one_line_error(run_dspark(base + "-2", tmp), "--top-k: expected -1 or 0 (disabled) or a positive integer, got -2");
}

TEST_F(Cli, BudgetBeyondTheContextIsWarnedAbout) {
  auto r = run_dspark("generate -m smollm2 -p 'Count: one, two, three' -c 12 -n 100000000 --temp 0 --drafter none", tmp);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err.rfind("warning: -n 100000000 asks for more tokens than fit: a context of 12 holds the ", 0), 0u) << r.err;
  auto fits = run_dspark("generate -m smollm2 -p 'Count: one, two, three' -c 64 -n 4 --temp 0 --drafter none", tmp);
  ASSERT_EQ(fits.status, 0) << fits.err;
  EXPECT_EQ(fits.err.find("warning"), std::string::npos) << fits.err;
}

TEST_F(Cli, OutputEndingInsideACharacterDropsItsBytes) {
  // 32 tokens of this answer end inside a multi-byte character: the cut
  // character is left out (it used to end the text as U+FFFD), in the JSON
  // text and in the streamed text alike; 33 tokens complete it.
  const std::string args = "generate -m smollm2 -p 'Translate to Japanese: good morning, thank you' --chat "
                           "--temp 0 --drafter none -n ";
  auto r = run_dspark(args + "32 --json", tmp);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("tokens").size(), 32u);
  const std::string text = j.at("text").get<std::string>();
  EXPECT_EQ(text.find("\xEF\xBF\xBD"), std::string::npos) << text;
  EXPECT_TRUE(j.at("seed").is_null()) << "greedy decoding draws nothing";
  EXPECT_TRUE(j.at("sampling_rule").is_null());
  auto streamed = run_dspark(args + "32", tmp);
  ASSERT_EQ(streamed.status, 0) << streamed.err;
  EXPECT_EQ(streamed.out, text + "\n");
  auto longer = run_dspark(args + "33 --json", tmp);
  ASSERT_EQ(longer.status, 0) << longer.err;
  const std::string more = nlohmann::json::parse(longer.out).at("text").get<std::string>();
  EXPECT_EQ(more.rfind(text, 0), 0u) << more;
  EXPECT_GT(more.size(), text.size() + 1) << "the 33rd token completes a multi-byte character";
}

TEST_F(Cli, PromptFromAFileOrStandardInput) {
  const std::string args = "generate -m smollm2 -n 6 --temp 0 --drafter none --json ";
  auto direct = run_dspark(args + "-p 'Once upon a time, \"quoted\" and $HOME'", tmp);
  ASSERT_EQ(direct.status, 0) << direct.err;
  const std::string path = tmp.file("prompt.txt");
  write_bytes(path, "Once upon a time, \"quoted\" and $HOME\n");  // one trailing newline is dropped
  auto file = run_dspark(args + "-f " + path, tmp);
  ASSERT_EQ(file.status, 0) << file.err;
  auto piped = run_dspark(args + "-p - <" + path, tmp);
  ASSERT_EQ(piped.status, 0) << piped.err;
  const auto tokens = nlohmann::json::parse(direct.out).at("tokens");
  EXPECT_EQ(nlohmann::json::parse(file.out).at("tokens"), tokens);
  EXPECT_EQ(nlohmann::json::parse(piped.out).at("tokens"), tokens);
  EXPECT_EQ(nlohmann::json::parse(file.out).at("stats").at("prompt_tokens"),
            nlohmann::json::parse(direct.out).at("stats").at("prompt_tokens"));
  expect_one_line_error(run_dspark("generate -m smollm2 -n 2", tmp), "a prompt is required: -p TEXT, -p - (standard input) or -f FILE");
  expect_one_line_error(run_dspark("generate -m smollm2 -n 2 -f " + tmp.file("missing.txt"), tmp), tmp.file("missing.txt"));
  expect_one_line_error(run_dspark("generate -m smollm2 -n 2 -p x -f " + path, tmp), "excludes");
}

TEST_F(Cli, SeedGivesTheSameTokensWithAndWithoutADrafter) {
  // A named seed selects seed-stable sampling: the shipped drafter at every
  // γ 1..8 and every verify schedule emits exactly the plain-sampled tokens.
  namespace fs = std::filesystem;
  const fs::path home = tmp.path() / "home";  // a fresh SPS profile for "auto"
  fs::create_directories(home);
  fs::create_directory_symlink(fs::path(model_path()).parent_path(), home / "models");
  const std::string env = "DSPARK_HOME=" + home.string() + " ";
  const std::string gen = "generate -m smollm2 --chat -p 'Tell me a story about a dragon.' -n 40 --temp 0.8 "
                          "--seed 31 --json ";
  const auto plain = run_dspark(gen + "--drafter none", tmp, env);
  ASSERT_EQ(plain.status, 0) << plain.err;
  const auto jp = nlohmann::json::parse(plain.out);
  EXPECT_EQ(jp.at("sampling_rule"), "seed-stable");
  ASSERT_EQ(jp.at("tokens").size(), 40u);
  // Every γ in make test-full; one γ per schedule otherwise (the in-process
  // SeedStable suite sweeps every γ and schedule).
  const char* schedules[] = {"auto", "off", "thresholds"};
  const std::vector<int> gammas = test::full_mode() ? std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8} : std::vector<int>{2, 6, 7};
  int64_t accepted = 0;
  for (const int g : gammas) {
    const std::string schedule = schedules[g % 3];
    const auto r = run_dspark(gen + "--drafter auto --gamma " + std::to_string(g) + " --schedule " + schedule, tmp, env);
    ASSERT_EQ(r.status, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j.at("tokens"), jp.at("tokens")) << "gamma " << g << " schedule " << schedule;
    accepted += j.at("stats").value("accepted", int64_t{0});
  }
  EXPECT_GT(accepted, 0);
  // Without a seed the rule is rejection sampling (docs/sampling.md).
  const auto unseeded = run_dspark("generate -m smollm2 -p hi -n 2 --temp 0.8 --drafter none --json", tmp, env);
  ASSERT_EQ(unseeded.status, 0) << unseeded.err;
  EXPECT_EQ(nlohmann::json::parse(unseeded.out).at("sampling_rule"), "rejection");
}

TEST_F(Cli, DrafterOptionsWithoutADrafterAreReported) {
  // --gamma and the pruning options set a drafter's blocks: without one they
  // do nothing, and the user is told so (the output is still plain decoding).
  const auto r = run_dspark("generate -m smollm2 -p hi -n 2 --temp 0 --drafter none --gamma 4 --min-conf 0.5", tmp);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("warning: --gamma, --min-conf ignored with --drafter none"), std::string::npos) << r.err;
  const auto quiet = run_dspark("generate -m smollm2 -p hi -n 2 --temp 0 --drafter none", tmp);
  ASSERT_EQ(quiet.status, 0) << quiet.err;
  EXPECT_EQ(quiet.err.find("ignored with"), std::string::npos) << quiet.err;
}

TEST_F(Cli, OneTokenHasNoDecodeRate) {
  // The only token comes from the prefill call: there is no decode rate to report.
  auto r = run_dspark("generate -m smollm2 -p hi -n 1 --drafter none", tmp);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("decode: 1 token, - tok/s"), std::string::npos) << r.err;
}

TEST_F(Cli, SeedMinusOneIsRandomAndReported) {
  // -1 (llama.cpp's "random seed") draws a seed and reports it; the reported
  // seed reproduces the same text.
  auto a = run_dspark("generate -m smollm2 -p 'Once upon a time' -n 12 --drafter none --temp 1 --seed -1 --json", tmp);
  ASSERT_EQ(a.status, 0) << a.err;
  const auto ja = nlohmann::json::parse(a.out);
  const auto seed = ja.at("seed").get<uint64_t>();
  auto b = run_dspark("generate -m smollm2 -p 'Once upon a time' -n 12 --drafter none --temp 1 --json --seed " +
                          std::to_string(seed),
                      tmp);
  ASSERT_EQ(b.status, 0) << b.err;
  EXPECT_EQ(nlohmann::json::parse(b.out).at("tokens"), ja.at("tokens"));
  auto c = run_dspark("generate -m smollm2 -p hi -n 2 --drafter none --temp 1 --seed 7", tmp);
  ASSERT_EQ(c.status, 0) << c.err;
  EXPECT_NE(c.err.find("| seed 7"), std::string::npos) << c.err;
  expect_one_line_error(run_dspark("generate -m smollm2 -p hi -n 2 --seed -2", tmp), "-1 (a random seed)");
  expect_one_line_error(run_dspark("generate -m smollm2 -p hi -n 2 --seed 18446744073709551616", tmp),
                        "integer in [0, 2^64)");
}

TEST_F(Cli, FullContextIsReported) {
  auto r = run_dspark("generate -m smollm2 -p 'Count: one, two, three' -c 10 -n 50 --temp 0 --drafter none", tmp);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("stopped: the context of 10 tokens is full"), std::string::npos) << r.err;
  auto j = run_dspark("generate -m smollm2 -p 'Count: one, two, three' -c 10 -n 50 --temp 0 --json", tmp);
  ASSERT_EQ(j.status, 0) << j.err;
  EXPECT_EQ(nlohmann::json::parse(j.out).at("finish_reason"), "context_full");
}

TEST_F(Cli, TooManyThresholdsForGamma) {
  expect_one_line_error(run_dspark("generate -m smollm2 -p hi -n 2 --gamma 2 --thresholds 0.1,0.2,0.3", tmp),
                        "expected at most gamma = 2 values");
}

TEST_F(Cli, AutoDrafterFollowsTheTargetGivenAsAPath) {
  // The shipped drafter is found by the target's id, not only by the alias.
  auto r = run_dspark("generate -m " + model_path() + " -p 'The capital of France is' -n 8 --temp 0 --json", tmp);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(nlohmann::json::parse(r.out).at("stats").contains("tau")) << r.out;
}

TEST_F(Cli, UnknownCommandIsNamed) {
  expect_one_line_error(run_dspark("genrate -m smollm2 -p hi", tmp), "unknown command 'genrate'");
}

// Parse errors say what was expected: the commands, the kind of value, how often.
TEST_F(Cli, ParseErrorsSayWhatWasExpected) {
  expect_one_line_error(run_dspark("", tmp), "a command is required (expected one of: generate, ");
  expect_one_line_error(run_dspark("generate -m smollm2 --temp abc -p hi", tmp), "--temp: expected a number, got 'abc'");
  expect_one_line_error(run_dspark("generate -m smollm2 -p hi -p there", tmp), "--prompt: given 2 times, expected once");
  expect_one_line_error(run_dspark("generate -m smollm2 --top-k x -p hi", tmp), "--top-k: expected an integer, got 'x'");
}

TEST_F(Cli, ProfileOfAnotherModelIsWarnedAbout) {
  const std::string prof = (tmp.path() / "other.json").string();
  std::ofstream(prof) << R"({"model": "llama/other-model", "threads": 2, "context": 64, "b": [1, 2, 3, 4, 5, 6, 7, 8],
                             "sps": [100, 90, 85, 80, 75, 70, 66, 62]})";
  auto r = run_dspark("generate -m smollm2 -p hi -n 4 --temp 0 --schedule sps --profile " + prof, tmp);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("warning: SPS profile " + prof + " was measured for model llama/other-model, not llama/"),
            std::string::npos)
      << r.err;
}

TEST_F(Cli, AutoScheduleMeasuresAProfileOnFirstUse) {
  // A DSPARK_HOME with the models but no profiles: the first speculative run
  // measures this machine's SPS profile (silently when stderr is not a
  // terminal), saves it, and decodes exactly as plain decoding does.
  namespace fs = std::filesystem;
  const fs::path home = tmp.path() / "home";
  fs::create_directories(home);
  fs::create_directory_symlink(fs::path(model_path()).parent_path(), home / "models");
  const std::string env = "DSPARK_HOME=" + home.string() + " ";
  const std::string gen = "generate -m smollm2 --chat --temp 0 -n 16 --json -p 'Name three colors.'";
  const auto plain = run_dspark(gen + " --drafter none", tmp);
  ASSERT_EQ(plain.status, 0) << plain.err;
  // --schedule off drafts and verifies every round: nothing is measured.
  auto r = run_dspark(gen + " --schedule off", tmp, env);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_FALSE(fs::exists(home / "profiles")) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out).at("text"), nlohmann::json::parse(plain.out).at("text"));
  // Explicit thresholds schedule by confidence alone, but the drafter-skip
  // rule prices rounds on the profile: it is measured on first use too.
  r = run_dspark(gen + " --thresholds 0.5", tmp, env);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_TRUE(fs::exists(home / "profiles")) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out).at("text"), nlohmann::json::parse(plain.out).at("text"));
  fs::remove_all(home / "profiles");
  r = run_dspark(gen, tmp, env);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(nlohmann::json::parse(r.out).at("text"), nlohmann::json::parse(plain.out).at("text"));
  std::vector<fs::path> saved;
  for (const auto& e : fs::directory_iterator(home / "profiles")) saved.push_back(e.path());
  ASSERT_EQ(saved.size(), 1u);
  const auto prof = nlohmann::json::parse(read_bytes(saved[0].string()));
  EXPECT_EQ(prof.at("sps").size(), 17u);  // B up to 1 + the longest lookup draft (16)
  EXPECT_EQ(prof.at("context"), 256);
  for (double v : prof.at("sps")) EXPECT_GT(v, 0.0);
  // A damaged default profile is reported and measured again, not fatal.
  std::ofstream(saved[0]) << "{bad";
  r = run_dspark(gen, tmp, env);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("warning: ignoring the SPS profile " + saved[0].string()), std::string::npos) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out).at("text"), nlohmann::json::parse(plain.out).at("text"));
  EXPECT_EQ(nlohmann::json::parse(read_bytes(saved[0].string())).at("sps").size(), 17u);  // B up to 1 + the longest lookup draft (16)
}

TEST_F(Cli, ConfidencePruningStillSkipsADrafterThatDoesNotPay) {
  // An untrained drafter is almost never accepted: with --min-conf (pruning
  // alone, no SPS schedule) the drafter-skip rule turns it off after its
  // warm-up and a few explorations, as it does by default; --schedule off
  // runs it every round. Both decode what plain decoding does.
  const std::string dir = (tmp.path() / "untrained").string();
  ASSERT_EQ(run_dspark("init-drafter -m smollm2 --out " + dir + " --head markov --gamma 7", tmp).status, 0);
  const std::string gen = "generate -m smollm2 --chat --temp 0 -n 96 --json --lookup-ngram 0 -p 'Why is the sky blue?' ";
  const auto plain = run_dspark(gen + "--drafter none", tmp);
  ASSERT_EQ(plain.status, 0) << plain.err;
  const auto rounds = [&](const std::string& flags) {
    const auto r = run_dspark(gen + "--drafter " + dir + " " + flags, tmp);
    EXPECT_EQ(r.status, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j.at("tokens"), nlohmann::json::parse(plain.out).at("tokens")) << flags;
    return j.at("stats").at("drafter_rounds").get<int64_t>();
  };
  EXPECT_LE(rounds("--min-conf 0.3"), 24);
  EXPECT_GE(rounds("--schedule off"), 40);
}

TEST_F(Cli, OutputThatCannotBeWrittenIsAnError) {
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  const std::string err = (tmp.path() / "stderr").string();
  for (const std::string args : {"generate -m smollm2 -p hi -n 4 --drafter none", "generate -m smollm2 -p hi -n 4 --json"}) {
    const int rc = std::system((std::string(DSPARK_BINARY) + " " + args + " >/dev/full 2>" + err).c_str());
    EXPECT_EQ(WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, 2) << args;
    EXPECT_NE(read_bytes(err).find("error: cannot write the output: No space left on device"), std::string::npos)
        << args << ": " << read_bytes(err);
  }
}

TEST_F(Cli, EmptyDrafterArgument) {
  expect_one_line_error(run_dspark("generate -m smollm2 -p hi -n 2 --drafter ''", tmp),
                        "--drafter: expected a directory, 'none' or 'auto', got an empty string");
}

TEST_F(Cli, DirectoryWhereAFileBelongs) {
  // A directory given as a profile file gets a clear error, not a stream failure.
  expect_one_line_error(run_dspark("generate -m smollm2 -p hi -n 2 --schedule sps --profile " + tmp.path().string(), tmp),
                        "an SPS profile (JSON file) expected, found a directory");
  const std::string fifo = (tmp.path() / "model.gguf").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_one_line_error(run_dspark("generate -m " + fifo + " -p hi -n 2", tmp), "not a regular file");
}

TEST_F(Cli, BadOptionValue) {
  auto r = run_dspark("generate -m smollm2 -p hi -n notanumber", tmp);
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
}

TEST_F(Cli, RangeOptionsSayWhatIsExpected) {
  expect_one_line_error(run_dspark("generate -m smollm2 -p hi --gamma x", tmp),
                        "--gamma: expected an integer in [0, 32], got 'x'");
  expect_one_line_error(run_dspark("generate -m smollm2 -p hi --gamma 33", tmp),
                        "--gamma: expected an integer in [0, 32], got '33'");
  expect_one_line_error(run_dspark("generate -m smollm2 -p hi --min-conf 2", tmp),
                        "--min-conf: expected a number in [0, 1], got '2'");
  expect_one_line_error(run_dspark("generate -m smollm2 -p hi -n 99999999999999999999", tmp),
                        "--n-predict: expected a positive integer, got '99999999999999999999' (past the 64-bit range)");
}

TEST_F(Cli, ProfilePastTheContextSaysSoBeforeAnyOutput) {
  auto r = run_dspark("profile -m smollm2 --context 9000 --bmax 2", tmp);
  expect_one_line_error(r, "profile: context 9000 + bmax 2 exceeds the model's context length 8192");
  EXPECT_EQ(r.out, "") << "a header printed before the error";
}

TEST_F(Cli, OutputPathsAreCheckedBeforeTheWork) {
  const std::string text = (tmp.path() / "t.txt").string();
  write_bytes(text, "The quick brown fox jumps over the lazy dog. ");
  const std::string ppl = "perplexity -m smollm2 -f " + text + " -c 128 --chunks 1";
  // No model is loaded: nothing of the run is printed before the error.
  for (const auto& [arg, what] : std::vector<std::pair<std::string, std::string>>{
           {"--json ''", "--json: expected a path, got an empty string"},
           {"--json /proc/version", "--json /proc/version: cannot write a file in /proc"},
           {"--json " + tmp.path().string(), "is a directory, expected a file path"}}) {
    auto r = run_dspark(ppl + " " + arg, tmp);
    expect_one_line_error(r, what);
    EXPECT_EQ(r.out.find("estimate"), std::string::npos) << r.out;
  }
  expect_one_line_error(run_dspark("init-drafter -m smollm2 --out ''", tmp), "--out: expected a path");
}

TEST_F(Cli, MissingShippedDrafterIsWarnedAbout) {
  // DSPARK_DRAFTERS replaces the places searched for an alias's drafter.
  const std::string empty = (tmp.path() / "no-drafters").string();
  std::filesystem::create_directories(empty);
  auto r = run_dspark("generate -m smollm2 -p hi -n 4 --temp 0 --lookup-ngram 0", tmp, "DSPARK_DRAFTERS=" + empty + " ");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("warning: no drafter for 'smollm2' in " + empty + "/"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("tau"), std::string::npos) << r.err;
  r = run_dspark("generate -m smollm2 -p hi -n 4 --temp 0 --lookup-ngram 0", tmp,
                 "DSPARK_DRAFTERS=" DSPARK_SOURCE_DIR "/drafters ");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err.find("warning"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("tau"), std::string::npos) << r.err;
}

TEST_F(Cli, DrafterForAnotherTargetIsRefused) {
  const auto tiny = tmp.path() / "tiny.gguf";
  write_tiny_llama(tiny.string(), 3);
  const std::string dir = (tmp.path() / "tiny-drafter").string();
  ASSERT_EQ(run_dspark("init-drafter -m " + tiny.string() + " --out " + dir, tmp).status, 0);
  auto r = run_dspark("generate -m smollm2 -p hi --drafter " + dir, tmp);
  expect_one_line_error(r, "drafter/target mismatch");
  EXPECT_NE(r.err.find("smollm2"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("tiny-llama"), std::string::npos) << r.err;
}

TEST_F(Cli, MissingDrafterDirectory) {
  expect_one_line_error(run_dspark("generate -m smollm2 -p hi --drafter /nonexistent/drafter", tmp),
                        "does not exist");
}

}  // namespace
}  // namespace dspark::test
