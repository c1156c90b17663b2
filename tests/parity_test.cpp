// Parity with llama.cpp on the real SmolLM2 model.
//
// tests/golden/llamacpp_greedy.json holds llama.cpp's greedy 32-token
// continuations of the dev prompts (scripts/oracle/greedy_golden.mjs, CPU
// build of node-llama-cpp on the same Q4_1 GGUF), with the prompt rendered by
// the GGUF's own chat template. These tests check that
//   * our chat template + tokenizer produce exactly llama.cpp's prompt tokens;
//   * our greedy decoding follows llama.cpp's, and wherever it does not, the
//     first divergence is a near-tie: our logit for our top-1 exceeds our
//     logit for llama.cpp's token by less than kMaxDivergenceGap;
//   * teacher-forced on llama.cpp's tokens, our argmax agrees with llama.cpp's
//     next token at >= 97% of the positions.
//
// Exact agreement on every prompt is not a meaningful target: llama.cpp
// multiplies Q4_1 weights by activations quantized to 8 bits, we dequantize
// the weights to bf16 and keep bf16 activations, so logits differ by a few
// tenths and greedy paths split wherever the top two tokens are that close.
// Two llama.cpp builds (node-llama-cpp 3.3.1 and 3.7.0) on this file already
// disagree with each other on more than half of the prompts, every time at
// such a near-tie (see scripts/oracle/README.md for the measured figures).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dspark/model/loaded_model.hpp"
#include "dspark/spec/generate.hpp"
#include "test_util.hpp"

namespace {

using dspark::TokenId;
using nlohmann::json;

// The largest logit gap, in our logits, allowed between our top-1 and
// llama.cpp's token at a divergence. The quantization difference between the
// two engines moves a top-1/top-2 logit gap by up to a few tenths (measured
// over every teacher-forced position against llama.cpp's own gaps, printed
// by TeacherForcedArgmaxAgreement); a gap of 0.5 is still a near-tie
// (probability ratio e^0.5 = 1.65) while a real defect (wrong position,
// wrong RoPE, wrong norm, a broken kernel) moves logits by several units.
constexpr double kMaxDivergenceGap = 0.5;
// Teacher-forced positions where our argmax must equal llama.cpp's token.
constexpr double kMinTeacherForcedAgreement = 0.97;
// Prompts whose whole greedy continuation must equal llama.cpp's. Measured
// 18 of 40 (AVX512-BF16 kernels); the floor leaves room for the other kernel
// path, whose different rounding can flip a few more near-ties.
constexpr int kMinIdenticalPrompts = 14;

struct GoldenPrompt {
  std::string id;
  std::string prompt;
  std::vector<TokenId> prompt_tokens;
  std::vector<TokenId> generated;  // ends with the end-of-generation id when stopped_at_eog
  bool stopped_at_eog = false;
  // llama.cpp's two most probable tokens and their probabilities per generated position.
  std::vector<std::pair<TokenId, double>> top1, top2;
};

struct Golden {
  json meta;
  std::vector<GoldenPrompt> prompts;
  std::vector<TokenId> eog;
  bool has_top2 = false;
};

// Our teacher-forced view of one golden continuation: one forward over the
// prompt and the golden tokens, logits at every position.
struct TeacherForced {
  std::vector<TokenId> top1;        // our argmax before generated position k
  std::vector<double> gap_golden;   // our logit(top1) - logit(golden token), >= 0
  std::vector<double> gap_llama_pair;  // our logit(llama top-1) - logit(llama top-2), when recorded
};

struct State {
  std::unique_ptr<dspark::LoadedModel> model;
  Golden golden;
  std::vector<std::optional<TeacherForced>> forced;
};

Golden read_golden() {
  const std::string path = DSPARK_SOURCE_DIR "/tests/golden/llamacpp_greedy.json";
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot read " + path);
  Golden g;
  g.meta = json::parse(f);
  g.eog = g.meta.at("eog_tokens").get<std::vector<TokenId>>();
  g.has_top2 = g.meta.value("top2", false);
  for (const auto& p : g.meta.at("prompts")) {
    GoldenPrompt gp;
    gp.id = p.at("id").get<std::string>();
    gp.prompt = p.at("prompt").get<std::string>();
    gp.prompt_tokens = p.at("prompt_tokens").get<std::vector<TokenId>>();
    gp.generated = p.at("generated_tokens").get<std::vector<TokenId>>();
    gp.stopped_at_eog = p.at("stopped_at_eog").get<bool>();
    if (g.has_top2) {
      for (const auto& pos : p.at("top2")) {
        gp.top1.emplace_back(pos.at(0).at(0).get<TokenId>(), pos.at(0).at(1).get<double>());
        gp.top2.emplace_back(pos.at(1).at(0).get<TokenId>(), pos.at(1).at(1).get<double>());
      }
    }
    g.prompts.push_back(std::move(gp));
  }
  g.meta.erase("prompts");
  return g;
}

// One model load and one golden parse for every test of the suite.
State& state() {
  static State s = [] {
    State st;
    st.model = std::make_unique<dspark::LoadedModel>(
        dspark::LoadedModel::load(dspark::test::model_path()));
    st.golden = read_golden();
    st.forced.resize(st.golden.prompts.size());
    return st;
  }();
  return s;
}

bool is_eog(const Golden& g, TokenId t) {
  return std::find(g.eog.begin(), g.eog.end(), t) != g.eog.end();
}

const TeacherForced& teacher_forced(size_t i) {
  State& s = state();
  if (!s.forced[i]) {
    const GoldenPrompt& p = s.golden.prompts[i];
    auto& target = *s.model->target;
    std::vector<TokenId> seq = p.prompt_tokens;
    // The last golden token is never an input: nothing is predicted after it.
    seq.insert(seq.end(), p.generated.begin(), p.generated.end() - 1);
    auto cache = target.new_cache(static_cast<int64_t>(seq.size()));
    const at::Tensor logits =
        target.forward_one(cache, seq, dspark::Logits::All).logits.contiguous();
    const int64_t V = logits.size(1);
    const float* base = logits.data_ptr<float>();
    TeacherForced tf;
    const size_t P = p.prompt_tokens.size();
    for (size_t k = 0; k < p.generated.size(); ++k) {
      const float* row = base + static_cast<int64_t>(P - 1 + k) * V;
      const TokenId top = dspark::argmax(row, V);
      tf.top1.push_back(top);
      tf.gap_golden.push_back(static_cast<double>(row[top]) - row[p.generated[k]]);
      if (k < p.top2.size())
        tf.gap_llama_pair.push_back(static_cast<double>(row[p.top1[k].first]) - row[p.top2[k].first]);
    }
    s.forced[i] = std::move(tf);
  }
  return *s.forced[i];
}

// llama.cpp's own logit gap between its top two tokens at position k, when recorded.
std::optional<double> llama_gap(const GoldenPrompt& p, size_t k) {
  if (k >= p.top2.size() || p.top2[k].second <= 0) return std::nullopt;
  return std::log(p.top1[k].second / p.top2[k].second);
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(std::lround(q * static_cast<double>(v.size() - 1)))];
}

class LlamaCppParity : public ::testing::Test {
 protected:
  void SetUp() override {
    DSPARK_REQUIRE_MODEL();
    ASSERT_NO_THROW(state());
  }
};

TEST_F(LlamaCppParity, GoldenDescribesThisModelAndTemplate) {
  const State& s = state();
  const json& m = s.golden.meta;
  EXPECT_EQ(m.at("model_file").get<std::string>(), "SmolLM2-135M-Instruct.Q4_1.gguf");
  EXPECT_EQ(m.at("max_new_tokens").get<int>(), 32);
  ASSERT_EQ(s.golden.prompts.size(), 40u);
  ASSERT_TRUE(s.model->chat.has_value());
  // The golden's rendering of one user message equals ours, default system turn included.
  EXPECT_EQ(m.at("template").get<std::string>(),
            s.model->chat->render({{"user", "{prompt}"}}, true));
  ASSERT_TRUE(s.model->chat->default_system_prompt().has_value());
  EXPECT_NE(m.at("template").get<std::string>().find(*s.model->chat->default_system_prompt()),
            std::string::npos);
  const auto eos = s.model->tokenizer->specials().eos;
  EXPECT_TRUE(is_eog(s.golden, eos)) << "eos " << eos << " is not among the golden eog_tokens";
  for (const auto& p : s.golden.prompts) {
    ASSERT_FALSE(p.generated.empty()) << p.id;
    EXPECT_EQ(p.stopped_at_eog, is_eog(s.golden, p.generated.back())) << p.id;
    if (!p.stopped_at_eog) {
      EXPECT_EQ(p.generated.size(), 32u) << p.id;
    }
    if (s.golden.has_top2) {
      EXPECT_EQ(p.top2.size(), p.generated.size()) << p.id;
    }
  }
}

TEST_F(LlamaCppParity, ChatPromptTokensMatch) {
  const State& s = state();
  int mismatches = 0;
  for (const auto& p : s.golden.prompts) {
    const auto ours = s.model->encode_prompt(p.prompt, true);
    EXPECT_EQ(ours, p.prompt_tokens) << p.id << ": chat prompt tokens differ from llama.cpp's";
    mismatches += ours != p.prompt_tokens;
  }
  std::printf("[parity] chat prompt tokens: %zu/%zu prompts identical to llama.cpp\n",
              s.golden.prompts.size() - static_cast<size_t>(mismatches), s.golden.prompts.size());
}

TEST_F(LlamaCppParity, GreedyDecodingDivergesOnlyAtNearTies) {
  State& s = state();
  const Golden& g = s.golden;
  auto& target = *s.model->target;
  dspark::GenerateOptions opts;
  opts.n_predict = 32;
  opts.sampling.temperature = 0.f;
  opts.stop_ids = g.eog;

  int identical = 0;
  double max_gap = 0;
  std::string report;
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < g.prompts.size(); ++i) {
    const GoldenPrompt& p = g.prompts[i];
    opts.ctx_size = static_cast<int64_t>(p.prompt_tokens.size()) + opts.n_predict + 1;
    const auto r = dspark::generate_plain(target, p.prompt_tokens, opts);
    const TeacherForced& tf = teacher_forced(i);

    // First position where our continuation (an end-of-generation id when we
    // stopped) leaves llama.cpp's. Golden positions always exist there: the
    // golden has 32 tokens or ends with its own end-of-generation id.
    size_t k = 0;
    while (k < r.tokens.size() && k < p.generated.size() && r.tokens[k] == p.generated[k]) ++k;
    const bool we_stopped_here = k == r.tokens.size() && r.stopped_by_eog;
    if (k == p.generated.size() ||
        (we_stopped_here && p.stopped_at_eog && k + 1 == p.generated.size() &&
         tf.top1[k] == p.generated[k])) {
      ++identical;
      continue;
    }
    ASSERT_LT(k, p.generated.size()) << p.id;
    // Our teacher-forced argmax reproduces our own greedy choice (batch-invariant
    // kernels: one forward over many tokens gives the same row as decoding).
    if (k < r.tokens.size()) {
      EXPECT_EQ(tf.top1[k], r.tokens[k]) << p.id << " position " << k;
    } else {
      EXPECT_TRUE(we_stopped_here && is_eog(g, tf.top1[k])) << p.id << " position " << k;
    }

    const double gap = tf.gap_golden[k];
    max_gap = std::max(max_gap, gap);
    EXPECT_LT(gap, kMaxDivergenceGap)
        << p.id << " diverges at generated position " << k << ": ours " << tf.top1[k]
        << ", llama.cpp " << p.generated[k] << ", our logit gap " << gap;
    char theirs[64] = "n/a";
    if (const auto lg = llama_gap(p, k)) {
      const bool ours_second = p.top2[k].first == tf.top1[k];
      std::snprintf(theirs, sizeof theirs, "%.3f (ours is %s 2nd)", *lg,
                    ours_second ? "its" : "not its");
    }
    char line[256];
    std::snprintf(line, sizeof line,
                  "[parity]   %s pos %2zu: ours %5d llama.cpp %5d | our gap %.3f | llama.cpp "
                  "top-2 gap %s\n",
                  p.id.c_str(), k, tf.top1[k], p.generated[k], gap, theirs);
    report += line;
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[parity] greedy %d/%zu prompts identical to llama.cpp %s (%s); "
              "largest divergence gap %.3f logits (limit %.2f); %.1f s\n%s",
              identical, g.prompts.size(), g.meta.value("node_llama_cpp_version", "?").c_str(),
              g.meta.value("llama_cpp_build", "?").c_str(), max_gap, kMaxDivergenceGap, secs,
              report.c_str());
  EXPECT_GE(identical, kMinIdenticalPrompts);
}

TEST_F(LlamaCppParity, TeacherForcedArgmaxAgreement) {
  const State& s = state();
  const Golden& g = s.golden;
  size_t positions = 0, agree = 0;
  std::vector<double> gap_error;  // |our top-1/top-2 logit gap - llama.cpp's| on llama.cpp's pair
  double worst_disagreement = 0;
  for (size_t i = 0; i < g.prompts.size(); ++i) {
    const GoldenPrompt& p = g.prompts[i];
    const TeacherForced& tf = teacher_forced(i);
    for (size_t k = 0; k < p.generated.size(); ++k) {
      ++positions;
      if (tf.top1[k] == p.generated[k])
        ++agree;
      else
        worst_disagreement = std::max(worst_disagreement, tf.gap_golden[k]);
      if (const auto lg = llama_gap(p, k); lg && k < tf.gap_llama_pair.size())
        gap_error.push_back(std::fabs(tf.gap_llama_pair[k] - *lg));
    }
  }
  const double rate = positions ? static_cast<double>(agree) / static_cast<double>(positions) : 0;
  std::printf("[parity] teacher-forced argmax: %zu/%zu positions agree (%.1f%%), "
              "largest gap where not %.3f logits\n",
              agree, positions, 100 * rate, worst_disagreement);
  if (!gap_error.empty()) {
    std::printf("[parity] |our - llama.cpp| top-1/top-2 logit gap over %zu positions: "
                "median %.3f, p95 %.3f, max %.3f\n",
                gap_error.size(), percentile(gap_error, 0.5), percentile(gap_error, 0.95),
                percentile(gap_error, 1.0));
  }
  EXPECT_GE(rate, kMinTeacherForcedAgreement);
  EXPECT_LT(worst_disagreement, kMaxDivergenceGap);
}

}  // namespace
