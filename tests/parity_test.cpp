// Parity with llama.cpp on the real models, one instance per family:
//
//   SmolLM2 (Llama): tests/golden/llamacpp_greedy.json holds llama.cpp's
//     greedy 32-token continuations of the dev prompts
//     (scripts/oracle/greedy_golden.mjs, CPU build of node-llama-cpp on the
//     same Q4_1 GGUF), with the prompt rendered by the GGUF's own chat template;
//   Gemma 3 270M: tests/golden/llamacpp_gemma_greedy.json holds llama.cpp's
//     greedy 32-token continuations of the completion prompts
//     (scripts/oracle/gemma_greedy_golden.py: llama-server built from source
//     on the same Q4_K_M GGUF), plain text with BOS (a base model), four of
//     them longer than the 512-token sliding window.
//
// With the same thresholds for both, these tests check that
//   * our chat template (or plain encoding) + tokenizer produce exactly
//     llama.cpp's prompt tokens;
//   * our greedy decoding follows llama.cpp's, and wherever it does not, the
//     first divergence is a near-tie: our logit for our top-1 exceeds our
//     logit for llama.cpp's token by less than kMaxDivergenceGap, or
//     llama.cpp's own top two are a near-tie (kReferenceTie);
//   * teacher-forced on llama.cpp's tokens, our argmax agrees with llama.cpp's
//     next token at >= 97% of the positions.
//
// Exact agreement on every prompt is not a meaningful target: llama.cpp
// multiplies Q4_1 weights by activations quantized to 8 bits, we dequantize
// the weights to bf16 and keep bf16 activations, so logits differ by a few
// tenths and greedy paths split wherever the top two tokens are that close.
// Two llama.cpp builds (node-llama-cpp 3.3.1 and 3.7.0) on this file already
// give different greedy continuations for about half of the prompts, each
// time at such a near-tie (see scripts/oracle/README.md for the figures).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dspark/model/loaded_model.hpp"
#include "dspark/speculative/generate.hpp"
#include "test_util.hpp"

namespace {

// One model and its golden file.
struct ParityCase {
  const char* name;
  const char* golden;            // under tests/golden/
  std::string (*model_path)();
  const char* model_file;
  size_t n_prompts;
  bool chat;                     // prompts rendered by the chat template
};

const ParityCase kCases[] = {
    {"SmolLM2", "llamacpp_greedy.json", dspark::test::model_path, "SmolLM2-135M-Instruct.Q4_1.gguf", 40, true},
    {"Gemma3", "llamacpp_gemma_greedy.json", dspark::test::gemma_model_path, "gemma-3-270m-q4_k_m.gguf", 20, false},
};

using dspark::TokenId;
using nlohmann::json;

// Thresholds, from the golden of node-llama-cpp 3.7.0 (llama.cpp b4980, which
// records llama.cpp's top-2 probabilities per position) on AVX512-BF16 kernels.
//
// Over all 1230 teacher-forced positions, our logit gap between llama.cpp's
// two most probable tokens differs from llama.cpp's own gap by median 0.10,
// p95 0.32, max 0.75 logits: that is the size of the arithmetic difference
// between the engines. The two llama.cpp builds differ from each other by as
// much (at one first divergence between them, 3.7.0 puts its own choice 0.87
// logits above 3.3.1's). A real defect (wrong position, RoPE, norm or kernel)
// moves logits by whole units and shows in the median first.
//
// Greedy: at the first divergence from llama.cpp, our top-1 may exceed
// llama.cpp's token by less than this (our logits). Measured max 0.24 over
// the 23 divergent prompts; every one of them is a near-tie on llama.cpp's
// side too (its top-2 gap <= 0.22) with our token as its runner-up.
constexpr double kMaxDivergenceGap = 0.5;
// Teacher-forced disagreements cover 30x more positions, so they reach further
// into the tail of the difference above (measured max 0.50, where llama.cpp's
// own gap is 0.03); this bound stays below where a defect would put them.
constexpr double kMaxTeacherForcedGap = 1.0;
// Teacher-forced positions where our argmax must equal llama.cpp's token
// (measured 1195/1230 = 97.2%).
constexpr double kMinTeacherForcedAgreement = 0.97;
// Median and p95 of |our - llama.cpp| top-1/top-2 logit gap (measured 0.10, 0.32).
constexpr double kMaxMedianGapError = 0.2;
constexpr double kMaxP95GapError = 0.5;
// Share of prompts whose whole greedy continuation must equal llama.cpp's
// (SmolLM2: measured 17 of 40, at least 15 required). The portable kernel path
// sums in another order, which can flip the closest near-ties (two
// divergences have gaps of 0.005 logits or less).
constexpr double kMinIdenticalShare = 15.0 / 40.0;
// Where we disagree with llama.cpp, our top-1 is its runner-up, or else a
// third token within this many logits of its top-1 in our logits (a
// three-way near-tie: llama.cpp's golden records only its top 2). Measured
// with quantized compute (int8 activations, as llama.cpp): 2 of 31
// teacher-forced disagreements, with our gaps 0.001 and 0.133.
constexpr double kThreeWayTie = 0.2;
// A first greedy divergence where llama.cpp's own top two tokens are within
// this many logits of each other (its recorded probabilities), and our token
// is its runner-up, is held to the teacher-forced bound instead of
// kMaxDivergenceGap: our gap plus llama.cpp's must stay below
// kMaxTeacherForcedGap. Reason: at such a position llama.cpp's choice is
// decided by its own rounding (the tie is below the median arithmetic
// difference between the engines; two llama.cpp builds split at such ties, one
// of them with a gap of 0.87 on the other build's side, see
// scripts/oracle/README.md), so its token carries no preference the stricter
// greedy bound could hold us to.
// What stays testable is what TeacherForcedArgmaxAgreement checks at every
// position with the same prefix, which a first divergence is: ours is one of
// llama.cpp's top two, and the engines' disagreement on that pair is within
// the bound a defect would exceed. Measured: Gemma 3, one divergence with our
// gap 0.545 where llama.cpp's is 0.006.
constexpr double kReferenceTie = 0.05;

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

Golden read_golden(const ParityCase& c) {
  const std::string path = std::string(DSPARK_SOURCE_DIR "/tests/golden/") + c.golden;
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
    if (gp.prompt_tokens.empty() || gp.generated.empty())
      throw std::runtime_error(path + ": " + gp.id + " has no prompt or generated tokens");
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

// One model load and one golden parse per case for every test of the suite.
State& state(const ParityCase& c) {
  static std::map<std::string, State> states;
  auto it = states.find(c.name);
  if (it == states.end()) {
    State st;
    st.model = std::make_unique<dspark::LoadedModel>(dspark::LoadedModel::load(c.model_path()));
    st.golden = read_golden(c);
    st.forced.resize(st.golden.prompts.size());
    it = states.emplace(c.name, std::move(st)).first;
  }
  return it->second;
}

bool is_eog(const Golden& g, TokenId t) {
  return std::find(g.eog.begin(), g.eog.end(), t) != g.eog.end();
}

const TeacherForced& teacher_forced(State& s, size_t i) {
  if (!s.forced[i]) {
    const GoldenPrompt& p = s.golden.prompts[i];
    auto& target = *s.model->target;
    // The prompt but its last token, then that token and the golden tokens with
    // logits at every position (batch-invariant kernels: the same rows as one
    // forward over everything). The last golden token is never an input:
    // nothing is predicted after it.
    const std::vector<TokenId> head(p.prompt_tokens.begin(), p.prompt_tokens.end() - 1);
    std::vector<TokenId> seq = {p.prompt_tokens.back()};
    seq.insert(seq.end(), p.generated.begin(), p.generated.end() - 1);
    auto cache = target.new_cache(static_cast<int64_t>(head.size() + seq.size()));
    if (!head.empty()) target.forward_one(cache, head, dspark::Logits::None);
    const at::Tensor logits =
        target.forward_one(cache, seq, dspark::Logits::All).logits.contiguous();
    const int64_t V = logits.size(1);
    const float* base = logits.data_ptr<float>();
    std::vector<TokenId> used = p.generated;
    for (size_t k = 0; k < p.top2.size(); ++k) {
      used.push_back(p.top1[k].first);
      used.push_back(p.top2[k].first);
    }
    for (TokenId t : used) {
      if (t < 0 || t >= V) throw std::runtime_error(p.id + ": golden token out of the vocabulary");
    }
    TeacherForced tf;
    for (size_t k = 0; k < p.generated.size(); ++k) {
      const float* row = base + static_cast<int64_t>(k) * V;
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

class LlamaCppParity : public ::testing::TestWithParam<ParityCase> {
 protected:
  void SetUp() override {
    if (!std::filesystem::is_regular_file(GetParam().model_path()))
      GTEST_FAIL() << "the model is missing: expected " << GetParam().model_path() << " (run make setup)";
    ASSERT_NO_THROW(state(GetParam()));
  }
  static State& st() { return state(GetParam()); }
};

TEST_P(LlamaCppParity, GoldenDescribesThisModelAndTemplate) {
  const State& s = st();
  const json& m = s.golden.meta;
  EXPECT_EQ(m.at("model_file").get<std::string>(), GetParam().model_file);
  EXPECT_EQ(m.at("max_new_tokens").get<int>(), 32);
  ASSERT_EQ(s.golden.prompts.size(), GetParam().n_prompts);
  if (GetParam().chat) {
    ASSERT_TRUE(s.model->chat.has_value());
    // The golden's rendering of one user message equals ours, default system turn included.
    EXPECT_EQ(m.at("template").get<std::string>(), s.model->chat->render({{"user", "{prompt}"}}, true));
    ASSERT_TRUE(s.model->chat->default_system_prompt().has_value());
    EXPECT_NE(m.at("template").get<std::string>().find(*s.model->chat->default_system_prompt()),
              std::string::npos);
  } else {
    EXPECT_FALSE(s.model->chat.has_value()) << "a base model declares no chat template";
  }
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

TEST_P(LlamaCppParity, PromptTokensMatch) {
  const State& s = st();
  int mismatches = 0;
  for (const auto& p : s.golden.prompts) {
    const auto ours = s.model->encode_prompt(p.prompt, GetParam().chat);
    EXPECT_EQ(ours, p.prompt_tokens) << p.id << ": prompt tokens differ from llama.cpp's";
    mismatches += ours != p.prompt_tokens;
  }
  std::printf("[parity] %s prompt tokens: %zu/%zu prompts identical to llama.cpp\n", GetParam().chat ? "chat" : "plain",
              s.golden.prompts.size() - static_cast<size_t>(mismatches), s.golden.prompts.size());
}

TEST_P(LlamaCppParity, GreedyDecodingDivergesOnlyAtNearTies) {
  State& s = st();
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
    const TeacherForced& tf = teacher_forced(s, i);

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
    const auto reference_gap = llama_gap(p, k);
    const bool reference_tie =
        reference_gap && *reference_gap < kReferenceTie && p.top2[k].first == tf.top1[k];
    if (reference_tie) {
      EXPECT_LT(gap + *reference_gap, kMaxTeacherForcedGap)
          << p.id << " diverges at generated position " << k << " (a near-tie for llama.cpp, gap "
          << *reference_gap << "): ours " << tf.top1[k] << ", llama.cpp " << p.generated[k]
          << ", our logit gap " << gap;
    } else {
      max_gap = std::max(max_gap, gap);
      EXPECT_LT(gap, kMaxDivergenceGap)
          << p.id << " diverges at generated position " << k << ": ours " << tf.top1[k]
          << ", llama.cpp " << p.generated[k] << ", our logit gap " << gap;
    }
    if (k < p.top2.size() && gap >= kThreeWayTie) {
      EXPECT_EQ(tf.top1[k], p.top2[k].first)
          << p.id << " position " << k << ": our top-1 is not llama.cpp's runner-up";
    }
    char theirs[64] = "n/a";
    if (reference_gap) {
      const bool ours_second = p.top2[k].first == tf.top1[k];
      std::snprintf(theirs, sizeof theirs, "%.3f (ours is %s 2nd)%s", *reference_gap,
                    ours_second ? "its" : "not its", reference_tie ? ", its near-tie" : "");
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
              "largest divergence gap %.3f logits (limit %.2f; llama.cpp's near-ties apart); %.1f s\n%s",
              identical, g.prompts.size(), g.meta.value("node_llama_cpp_version", "").c_str(),
              g.meta.value("llama_cpp_build", "?").c_str(), max_gap, kMaxDivergenceGap, secs,
              report.c_str());
  EXPECT_GE(identical, static_cast<int>(std::ceil(kMinIdenticalShare * static_cast<double>(g.prompts.size()))));
}

TEST_P(LlamaCppParity, TeacherForcedArgmaxAgreement) {
  State& s = st();
  const Golden& g = s.golden;
  size_t positions = 0, agree = 0, runner_up = 0;
  std::vector<double> gap_error;  // |our top-1/top-2 logit gap - llama.cpp's| on llama.cpp's pair
  double worst_disagreement = 0;
  for (size_t i = 0; i < g.prompts.size(); ++i) {
    const GoldenPrompt& p = g.prompts[i];
    const TeacherForced& tf = teacher_forced(s, i);
    for (size_t k = 0; k < p.generated.size(); ++k) {
      ++positions;
      if (tf.top1[k] == p.generated[k]) {
        ++agree;
      } else {
        worst_disagreement = std::max(worst_disagreement, tf.gap_golden[k]);
        EXPECT_LT(tf.gap_golden[k], kMaxTeacherForcedGap)
            << p.id << " position " << k << ": ours " << tf.top1[k] << ", llama.cpp "
            << p.generated[k];
        if (k < p.top2.size()) {
          runner_up += tf.top1[k] == p.top2[k].first;
          if (tf.gap_golden[k] >= kThreeWayTie) {
            EXPECT_EQ(tf.top1[k], p.top2[k].first)
                << p.id << " position " << k << ": our top-1 is not llama.cpp's runner-up";
          }
        }
      }
      if (const auto lg = llama_gap(p, k); lg && k < tf.gap_llama_pair.size())
        gap_error.push_back(std::fabs(tf.gap_llama_pair[k] - *lg));
    }
  }
  const double rate = positions ? static_cast<double>(agree) / static_cast<double>(positions) : 0;
  std::printf("[parity] teacher-forced argmax: %zu/%zu positions agree (%.1f%%); where not, "
              "largest gap %.3f logits, ours is llama.cpp's runner-up at %zu/%zu\n",
              agree, positions, 100 * rate, worst_disagreement, runner_up, positions - agree);
  EXPECT_GE(rate, kMinTeacherForcedAgreement);
  if (!gap_error.empty()) {
    const double median = percentile(gap_error, 0.5), p95 = percentile(gap_error, 0.95);
    std::printf("[parity] |our - llama.cpp| top-1/top-2 logit gap over %zu positions: "
                "median %.3f, p95 %.3f, max %.3f\n",
                gap_error.size(), median, p95, percentile(gap_error, 1.0));
    EXPECT_LT(median, kMaxMedianGapError);
    EXPECT_LT(p95, kMaxP95GapError);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, LlamaCppParity, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
