// Tests of `dspark serve`: stop-string matching, request parsing and response
// shapes (pure functions); the batching engine on a tiny random Llama
// (batched output equals single-request output, stop strings, cancellation,
// shutdown); and the whole server driven by the official `openai` Python
// client against the real SmolLM2 model (tests/serve/test_openai_client.py).
#include <ATen/Parallel.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dspark/error.hpp"
#include "dspark/model/loaded_model.hpp"
#include "dspark/serve/api.hpp"
#include "dspark/serve/auth.hpp"
#include "dspark/serve/engine.hpp"
#include "dspark/serve/metrics.hpp"
#include "dspark/serve/request_checks.hpp"
#include "dspark/serve/stop_matcher.hpp"
#include "dspark/speculative/drafter.hpp"
#include "dspark/speculative/generate.hpp"
#include "dspark/speculative/runner.hpp"
#include "test_util.hpp"

namespace dspark::serve {
namespace {

using namespace std::chrono_literals;

// ---- StopMatcher ------------------------------------------------------------------

// Pushes `pieces` in order; returns everything emitted (including the final flush).
std::string run_matcher(StopMatcher& m, const std::vector<std::string>& pieces) {
  std::string out;
  for (const auto& p : pieces) out += m.push(p);
  return out + m.flush();
}

TEST(StopMatcher, NoStopsPassesEverythingThrough) {
  StopMatcher m;
  EXPECT_EQ(m.push("Hello"), "Hello");
  EXPECT_EQ(m.push(" world"), " world");
  EXPECT_EQ(m.flush(), "");
  EXPECT_FALSE(m.matched());
}

TEST(StopMatcher, MatchAcrossPiecesIsNeverEmitted) {
  StopMatcher m({"STOP"});
  EXPECT_EQ(m.push("abc ST"), "abc ");  // "ST" could begin the stop string
  EXPECT_EQ(m.held(), "ST");
  EXPECT_EQ(m.push("O"), "");
  EXPECT_EQ(m.push("Pxyz"), "");
  EXPECT_TRUE(m.matched());
  EXPECT_EQ(m.matched_stop(), "STOP");
  EXPECT_EQ(m.push("more"), "");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, FalseStartIsReleased) {
  StopMatcher m({"STOP"});
  EXPECT_EQ(m.push("ST"), "");
  EXPECT_EQ(m.push("OX"), "STOX");
  EXPECT_FALSE(m.matched());
  // A held prefix comes out when generation ends.
  EXPECT_EQ(m.push("..STO"), "..");
  EXPECT_EQ(m.flush(), "STO");
}

TEST(StopMatcher, EarliestOfSeveralStopsWins) {
  StopMatcher m({"world", "o w", ""});
  EXPECT_EQ(run_matcher(m, {"hell", "o wor", "ld"}), "hell");
  EXPECT_EQ(m.matched_stop(), "o w");
  StopMatcher same_start({"abcd", "ab"});
  EXPECT_EQ(run_matcher(same_start, {"xxabcd"}), "xx");
  EXPECT_EQ(same_start.matched_stop(), "ab");
}

TEST(StopMatcher, OverlappingPrefixes) {
  // "aab" inside "aaab": the first 'a' is released once it cannot start a match.
  StopMatcher m({"aab"});
  EXPECT_EQ(m.push("a"), "");
  EXPECT_EQ(m.push("a"), "");
  EXPECT_EQ(m.push("a"), "a");
  EXPECT_EQ(m.push("b"), "");
  EXPECT_TRUE(m.matched());
}

TEST(StopMatcher, MultibyteStops) {
  StopMatcher m({"é!"});
  EXPECT_EQ(m.push("café"), "caf");
  EXPECT_EQ(m.push("!"), "");
  EXPECT_TRUE(m.matched());
  StopMatcher n({"éx"});
  EXPECT_EQ(run_matcher(n, {"caf", "é", "é"}), "caféé");
}

// Property: for random texts split at random points, the output equals the
// text up to the first occurrence of any stop (or the whole text).
TEST(StopMatcher, RandomSplitsMatchReference) {
  std::mt19937 rng(7);
  const std::vector<std::string> stops = {"ab", "bca", "ccc"};
  for (int iter = 0; iter < 2000; ++iter) {
    std::string text;
    const int n = 1 + static_cast<int>(rng() % 20);
    for (int i = 0; i < n; ++i) text += "abc"[rng() % 3];
    size_t first = std::string::npos;
    for (const auto& s : stops) first = std::min(first, text.find(s));
    const std::string expected = first == std::string::npos ? text : text.substr(0, first);
    std::vector<std::string> pieces;
    for (size_t i = 0; i < text.size();) {
      const size_t len = 1 + rng() % 4;
      pieces.push_back(text.substr(i, len));
      i += len;
    }
    StopMatcher m(stops);
    ASSERT_EQ(run_matcher(m, pieces), expected) << text;
    ASSERT_EQ(m.matched(), first != std::string::npos) << text;
  }
}

// ---- request parsing --------------------------------------------------------------

// The param named by the RequestError that parsing `body` throws.
std::string error_param(const std::string& body, Endpoint ep = Endpoint::Completions) {
  try {
    parse_request(body, ep, SamplingParams{});
  } catch (const RequestError& e) {
    EXPECT_FALSE(std::string(e.what()).empty());
    return e.param();
  }
  ADD_FAILURE() << "accepted: " << body;
  return "<accepted>";
}

// The message of the RequestError that parsing `body` throws.
std::string error_message(const std::string& body, Endpoint ep = Endpoint::Completions) {
  try {
    parse_request(body, ep, SamplingParams{});
  } catch (const RequestError& e) {
    return e.what();
  }
  ADD_FAILURE() << "accepted: " << body;
  return "<accepted>";
}

// A request sent to the other endpoint is pointed at the right one; a stop
// list names the element that is not a string.
TEST(ServeApi, MessagesSayWhatWasFound) {
  EXPECT_NE(error_message(R"({"messages": [{"role": "user", "content": "hi"}]})").find("/v1/chat/completions"),
            std::string::npos);
  EXPECT_NE(error_message(R"({"prompt": "hi"})", Endpoint::ChatCompletions).find("/v1/completions"),
            std::string::npos);
  EXPECT_EQ(error_message(R"({"max_tokens": 3})"), "'prompt' is required");
  EXPECT_NE(error_message(R"({"prompt": "hi", "stop": ["a", 3]})").find("got number 3 at index 1"), std::string::npos);
}

TEST(ServeApi, ParsesCompletionFields) {
  SamplingParams defaults;
  defaults.temperature = 0.7f;
  const ApiRequest r = parse_request(
      R"({"model": "m", "prompt": "Hi", "max_tokens": 12, "top_p": 0.5, "top_k": -1, "min_p": 0,
          "seed": 42, "stop": ["a", "", "bc"], "stream": true, "stream_options": {"include_usage": true},
          "logprobs": null, "unknown": {"x": [1, 2]}})",
      Endpoint::Completions, defaults);
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0][0].text, "Hi");
  EXPECT_EQ(r.max_tokens, 12);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.7f);  // the server default
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.5f);
  EXPECT_EQ(r.sampling.top_k, 0);
  EXPECT_FLOAT_EQ(r.sampling.min_p, 0.f);
  EXPECT_EQ(r.sampling.seed, 42u);
  EXPECT_TRUE(r.seed_given);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"a", "bc"}));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);

  const ApiRequest d = parse_request(R"({"prompt": "x", "stop": "END", "temperature": 0})",
                                     Endpoint::Completions, defaults);
  EXPECT_FALSE(d.max_tokens.has_value());
  EXPECT_TRUE(d.sampling.greedy());
  EXPECT_FALSE(d.seed_given);
  EXPECT_EQ(d.stop, std::vector<std::string>{"END"});
  EXPECT_FALSE(d.stream);
}

TEST(ServeApi, ParsesChatMessages) {
  const ApiRequest r = parse_request(
      R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                       {"role": "assistant", "content": "Hello!", "name": "bot"}],
          "max_completion_tokens": 5})",
      Endpoint::ChatCompletions, SamplingParams{});
  ASSERT_EQ(r.messages.size(), 3u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[2].content, "Hello!");
  EXPECT_EQ(r.max_tokens, 5);
  // An integer beyond int64 (parsed as a float) is held at the limit, where
  // the context check refuses it with the context's length.
  const ApiRequest huge = parse_request(R"({"prompt": "x", "max_tokens": 99999999999999999999})",
                                        Endpoint::Completions, SamplingParams{});
  EXPECT_EQ(huge.max_tokens, std::numeric_limits<int64_t>::max());
}

TEST(ServeApi, RejectsBadRequestsNamingTheField) {
  EXPECT_EQ(error_param(R"({"prompt": "hi",)"), "");
  EXPECT_EQ(error_param("[1]"), "");
  EXPECT_EQ(error_param(R"({"max_tokens": 3})"), "prompt");
  EXPECT_EQ(error_param(R"({"prompt": []})"), "prompt");
  EXPECT_EQ(error_param(R"({"prompt": [1.5]})"), "prompt");
  EXPECT_EQ(error_param(R"({"prompt": [-1]})"), "prompt");
  EXPECT_EQ(error_param(R"({"prompt": [[1], []]})"), "prompt");
  EXPECT_EQ(error_param(R"({"prompt": {"text": "a"}})"), "prompt");
  EXPECT_EQ(error_param(R"({"prompt": "a", "logprobs": true})"), "logprobs");
  EXPECT_EQ(error_param(R"({"prompt": "a", "logprobs": 21})"), "logprobs");
  EXPECT_EQ(error_param(R"({"prompt": "hi", "model": 3})"), "model");
  EXPECT_EQ(error_param(R"({"prompt": "hi", "max_tokens": "ten"})"), "max_tokens");
  EXPECT_EQ(error_param(R"({"prompt": "hi", "best_of": 2})"), "best_of");
  EXPECT_EQ(error_param(R"({"prompt": "hi", "echo": true})"), "echo");
  EXPECT_EQ(error_param(R"({"prompt": "hi", "logit_bias": {"50256": -100}})"), "logit_bias");
  EXPECT_EQ(error_param(R"({"prompt": "hi", "logit_bias": [1]})"), "logit_bias");
  EXPECT_EQ(error_param(R"({"prompt": "hi", "presence_penalty": 0.5})"), "presence_penalty");
  EXPECT_EQ(error_param(R"({"prompt": "hi", "frequency_penalty": 1})"), "frequency_penalty");
  EXPECT_EQ(error_param(R"({"prompt": "hi", "frequency_penalty": "x"})"), "frequency_penalty");
  EXPECT_EQ(error_param(R"({"prompt": "hi", "suffix": "x"})"), "suffix");
  EXPECT_EQ(error_param(R"({"prompt": "hi", "suffix": 3})"), "suffix");
  EXPECT_EQ(error_param(R"({"prompt": "hi", "tools": [{"type": "function"}]})"), "tools");
  EXPECT_EQ(error_param(R"({"prompt": "hi", "functions": [{"name": "f"}]})"), "functions");
  EXPECT_EQ(error_param(R"({"prompt": "hi", "tools": {}})"), "tools");
  EXPECT_EQ(error_param(R"({"prompt": "hi", "response_format": {"type": "json_object"}})"), "response_format");
  EXPECT_EQ(error_param(R"({"prompt": "hi", "response_format": "json"})"), "response_format");
  // Their neutral values pass.
  EXPECT_NO_THROW(parse_request(R"({"prompt": "hi", "best_of": 1, "echo": false, "logit_bias": {},
                                    "presence_penalty": 0, "frequency_penalty": 0.0, "suffix": "", "tools": [],
                                    "functions": null, "response_format": {"type": "text"}})",
                                Endpoint::Completions, SamplingParams{}));
  EXPECT_EQ(error_param(R"({"prompt": "hi", "max_tokens": 0})"), "max_tokens");
  EXPECT_EQ(error_param(R"({"prompt": "hi", "max_tokens": 2.5})"), "max_tokens");
  EXPECT_EQ(error_param(R"({"prompt": "hi", "temperature": "hot"})"), "temperature");
  EXPECT_EQ(error_param(R"({"prompt": "hi", "temperature": -0.1})"), "temperature");
  EXPECT_EQ(error_param(R"({"prompt": "hi", "temperature": 1e308})"), "temperature");  // inf as a float
  EXPECT_EQ(error_param(R"({"prompt": "hi", "frobnicate": 1e400})"), "");  // beyond double: not valid JSON
  EXPECT_EQ(error_param(R"({"prompt": "hi", "max_tokens": 4, "max_completion_tokens": "x"})"),
            "max_completion_tokens");
  EXPECT_EQ(error_param(R"({"prompt": "hi", "top_p": 0})"), "top_p");
  EXPECT_EQ(error_param(R"({"prompt": "hi", "top_p": 1.01})"), "top_p");
  EXPECT_EQ(error_param(R"({"prompt": "hi", "top_k": -2})"), "top_k");
  EXPECT_EQ(error_param(R"({"prompt": "hi", "min_p": 2})"), "min_p");
  EXPECT_EQ(error_param(R"({"prompt": "hi", "seed": "x"})"), "seed");
  EXPECT_EQ(error_param(R"({"prompt": "hi", "seed": -5})"), "seed");
  // -1 asks for a random seed, as on the command line.
  EXPECT_FALSE(parse_request(R"({"prompt": "hi", "seed": -1})", Endpoint::Completions, SamplingParams{}).seed_given);
  EXPECT_EQ(error_param(R"({"prompt": "hi", "stop": [1]})"), "stop");
  EXPECT_EQ(error_param(R"({"prompt": "hi", "stream": 1})"), "stream");
  EXPECT_EQ(error_param(R"({"prompt": "hi", "n": 2})"), "n");
  const auto chat = Endpoint::ChatCompletions;
  EXPECT_EQ(error_param(R"({"messages": "hi"})", chat), "messages");
  EXPECT_EQ(error_param(R"({"messages": []})", chat), "messages");
  EXPECT_EQ(error_param(R"({})", chat), "messages");
  EXPECT_EQ(error_param(R"({"messages": [{"role": "tool", "content": "x"}]})", chat), "messages");
  EXPECT_EQ(error_param(R"({"messages": [{"role": "user"}]})", chat), "messages");
  EXPECT_EQ(error_param(R"({"messages": [{"role": "user", "content": ["x"]}]})", chat), "messages");
  EXPECT_EQ(error_param(R"({"messages": [{"role": "user", "content": [{"type": "text"}]}]})", chat), "messages");
  EXPECT_EQ(error_param(R"({"messages": [3]})", chat), "messages");
  EXPECT_EQ(error_param(R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", chat),
            "top_logprobs");
  EXPECT_EQ(error_param(R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 30})",
                        chat),
            "top_logprobs");
}

TEST(ServeApi, ContentPartsArePlainText) {
  const ApiRequest r = parse_request(
      R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]},
                       {"role": "assistant", "content": [{"type": "text", "text": "Hi!"}]}]})",
      Endpoint::ChatCompletions, SamplingParams{});
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[0].content, "Hello\nthere");
  EXPECT_EQ(r.messages[1].content, "Hi!");
  try {
    parse_request(R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]})",
                  Endpoint::ChatCompletions, SamplingParams{});
    ADD_FAILURE() << "an image part was accepted";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.param(), "messages");
    EXPECT_EQ(std::string(e.what()),
              "'messages[0].content[1]': content parts of type 'image_url' are not supported: this server reads "
              "text only (parts of type 'text')");
  }
}

TEST(ServeApi, PromptListsAndTokenIds) {
  auto prompts = [](const std::string& prompt) {
    return parse_request(R"({"prompt": )" + prompt + "}", Endpoint::Completions, SamplingParams{}).prompts;
  };
  auto text = [](const std::string& t) { return PromptPiece{t, {}, true}; };
  auto ids = [](std::vector<TokenId> v) { return PromptPiece{{}, std::move(v), false}; };
  auto same = [](const std::vector<PromptInput>& a, const std::vector<PromptInput>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i].size() != b[i].size()) return false;
      for (size_t k = 0; k < a[i].size(); ++k)
        if (a[i][k].is_text != b[i][k].is_text || a[i][k].text != b[i][k].text || a[i][k].ids != b[i][k].ids)
          return false;
    }
    return true;
  };
  EXPECT_TRUE(same(prompts(R"("one")"), {{text("one")}}));
  EXPECT_TRUE(same(prompts(R"(["one", "two"])"), {{text("one")}, {text("two")}}));
  EXPECT_TRUE(same(prompts("[1, 2, 3]"), {{ids({1, 2, 3})}}));
  EXPECT_TRUE(same(prompts("[[1, 2], [3]]"), {{ids({1, 2})}, {ids({3})}}));
  // llama.cpp's mixed form: one prompt, strings tokenized in place.
  EXPECT_TRUE(same(prompts(R"([5, 6, " x", 7])"), {{ids({5, 6}), text(" x"), ids({7})}}));
  EXPECT_TRUE(same(prompts(R"([[5, "y"], "z"])"), {{ids({5}), text("y")}, {text("z")}}));
  std::string many = "[";
  for (size_t i = 0; i <= kMaxPrompts; ++i) many += std::string(i ? "," : "") + "\"p\"";
  EXPECT_EQ(error_param(R"({"prompt": )" + many + "]}"), "prompt");
}

TEST(ServeApi, LogprobsFields) {
  auto top = [](const std::string& body, Endpoint ep) { return parse_request(body, ep, SamplingParams{}).top_logprobs; };
  const auto chat = Endpoint::ChatCompletions;
  const std::string msg = R"("messages": [{"role": "user", "content": "x"}])";
  EXPECT_EQ(top(R"({"prompt": "a"})", Endpoint::Completions), -1);
  EXPECT_EQ(top(R"({"prompt": "a", "logprobs": 0})", Endpoint::Completions), 0);
  EXPECT_EQ(top(R"({"prompt": "a", "logprobs": 5})", Endpoint::Completions), 5);
  EXPECT_EQ(top("{" + msg + "}", chat), -1);
  EXPECT_EQ(top("{" + msg + R"(, "logprobs": false})", chat), -1);
  EXPECT_EQ(top("{" + msg + R"(, "logprobs": true})", chat), 0);
  EXPECT_EQ(top("{" + msg + R"(, "logprobs": true, "top_logprobs": 3})", chat), 3);
}

TEST(ServeApi, LogprobsShapes) {
  // "é" split over two tokens: chat keeps the exact bytes; completions
  // offsets count characters (a continuation byte starts none).
  const std::vector<TokenLogprob> entries = {{"Hi", -0.5f, {{"Hi", -0.5f}, {"Ho", -1.5f}}},
                                             {"\xC3", -0.25f, {}},
                                             {"\xA9!", -2.0f, {}}};
  int64_t offset = 0;
  const auto c = logprobs_json(Endpoint::ChatCompletions, entries, offset);
  ASSERT_EQ(c["content"].size(), 3u);
  EXPECT_EQ(c["content"][0]["token"], "Hi");
  EXPECT_EQ(c["content"][0]["logprob"], -0.5);
  EXPECT_EQ(c["content"][0]["bytes"], nlohmann::json::array({72, 105}));
  EXPECT_EQ(c["content"][0]["top_logprobs"][1]["token"], "Ho");
  EXPECT_EQ(c["content"][0]["top_logprobs"][1]["logprob"], -1.5);
  EXPECT_EQ(c["content"][1]["bytes"], nlohmann::json::array({0xC3}));
  EXPECT_TRUE(c["content"][2]["top_logprobs"].empty());
  EXPECT_TRUE(c["refusal"].is_null());
  offset = 10;
  const auto t = logprobs_json(Endpoint::Completions, entries, offset);
  EXPECT_EQ(t["token_logprobs"], nlohmann::json::array({-0.5, -0.25, -2.0}));
  EXPECT_EQ(t["text_offset"], nlohmann::json::array({10, 12, 13}));
  EXPECT_EQ(offset, 14);  // "Hi" + "é" + "!"
  EXPECT_EQ(t["top_logprobs"][0], (nlohmann::json{{"Hi", -0.5}, {"Ho", -1.5}}));
  EXPECT_TRUE(t["top_logprobs"][1].is_null());
  // A response of two choices: indices, and usage of both.
  RequestOutcome a, b;
  a.reason = FinishReason::Stop;
  a.prompt_tokens = 3;
  a.completion_tokens = 2;
  b.reason = FinishReason::Length;
  b.prompt_tokens = 4;
  b.completion_tokens = 5;
  const ResponseMeta meta{Endpoint::Completions, "cmpl-1", 1, "m"};
  const auto r = response_json(meta, {{"x", a, nullptr}, {"y", b, t}});
  EXPECT_EQ(r["choices"][1]["index"], 1);
  EXPECT_EQ(r["choices"][1]["text"], "y");
  EXPECT_EQ(r["choices"][1]["finish_reason"], "length");
  EXPECT_TRUE(r["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(r["choices"][1]["logprobs"]["text_offset"], t["text_offset"]);
  EXPECT_EQ(r["usage"]["prompt_tokens"], 7);
  EXPECT_EQ(r["usage"]["completion_tokens"], 7);
  EXPECT_EQ(chunk_json(meta, "z", nullptr, 1)["choices"][0]["index"], 1);
}

// ---- request checks shared by the CLI, the server and Python -------------------------

// The message of the InvalidArgument that `f` throws.
template <typename F>
std::string check_error(F&& f) {
  return test::message_of<InvalidArgument>(std::forward<F>(f));
}

TEST(RequestChecks, TopKMinusOneAndZeroDisable) {
  EXPECT_EQ(top_k_value(-1, "top_k"), 0);
  EXPECT_EQ(top_k_value(0, "top_k"), 0);
  EXPECT_EQ(top_k_value(40, "top_k"), 40);
  EXPECT_EQ(top_k_value(int64_t{1} << 40, "top_k"), std::numeric_limits<int>::max());
  EXPECT_EQ(check_error([] { top_k_value(-2, "--top-k"); }),
            "--top-k: expected -1 or 0 (disabled) or a positive integer, got -2");
}

TEST(RequestChecks, SeedsBeyond2To64AreRefusedNotWrapped) {
  EXPECT_EQ(seed_value("0", "seed"), uint64_t{0});
  EXPECT_EQ(seed_value("18446744073709551615", "seed"), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(seed_value("-1", "seed"), std::nullopt);
  for (const char* bad : {"18446744073709551616", "18446744073709551617", "-2", "", "1e3", " 1", "0x10"})
    EXPECT_EQ(check_error([&] { seed_value(bad, "seed"); }),
              std::string("seed: expected -1 (a random seed) or an integer in [0, 2^64), got '") + bad + "'")
        << bad;
  // The server reads the JSON number with its full value: 2^64 - 1 is that
  // seed (it used to be clamped to 2^63 - 1), 2^64 + 1 is refused (it used
  // to become seed 1 in Python).
  const ApiRequest top = parse_request(R"({"prompt": "x", "seed": 18446744073709551615})", Endpoint::Completions, {});
  EXPECT_EQ(top.sampling.seed, std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(error_param(R"({"prompt": "x", "seed": 18446744073709551617})"), "seed");
  EXPECT_EQ(error_param(R"({"prompt": "x", "seed": 1.5})"), "seed");
  EXPECT_EQ(parse_request(R"({"prompt": "x", "seed": 7.0})", Endpoint::Completions, {}).sampling.seed, 7u);
  // An integer written as a float above 2^53 is still that integer.
  EXPECT_EQ(parse_request(R"({"prompt": "x", "seed": 1e19})", Endpoint::Completions, {}).sampling.seed,
            uint64_t{10000000000000000000u});
  // A number of the wrong kind is quoted.
  try {
    parse_request(R"({"prompt": "x", "max_tokens": 5.5})", Endpoint::Completions, {});
    ADD_FAILURE() << "max_tokens 5.5 accepted";
  } catch (const RequestError& e) {
    EXPECT_STREQ(e.what(), "'max_tokens' must be an integer, got 5.5");
  }
}

TEST(RequestChecks, StopListsAndMaxTokens) {
  EXPECT_EQ(stop_strings({"a", "", "b"}, "stop"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(stop_strings(std::vector<std::string>(16, "x"), "stop").size(), 16u);
  EXPECT_EQ(check_error([] { stop_strings(std::vector<std::string>(20, "x"), "stop"); }),
            "stop: expected at most 16 stop strings, got 20");
  EXPECT_EQ(error_param(R"({"prompt": "x", "stop": ["1","2","3","4","5","6","7","8","9","10","11","12","13","14","15","16","17"]})"),
            "stop");
  EXPECT_NO_THROW(check_max_tokens(8, 8, 16, "max_tokens"));
  EXPECT_EQ(check_error([] { check_max_tokens(9, 8, 16, "max_tokens"); }),
            "max_tokens: prompt (8 tokens) + max_tokens (9) exceeds the context length (16)");
  EXPECT_NE(check_error([] { check_max_tokens(int64_t{1000000000000}, 8, 8192, "max_tokens"); }), "");
  EXPECT_EQ(check_error([] { check_max_tokens(16, 1, 16, "max_tokens"); }),
            "max_tokens: prompt (1 token) + max_tokens (16) exceeds the context length (16)");
  // A request's max_tokens past int64 (1e300) arrives held at the limit; the message says so.
  EXPECT_EQ(check_error([] { check_max_tokens(std::numeric_limits<int64_t>::max(), 8, 8192, "max_tokens"); }),
            "max_tokens: prompt (8 tokens) + max_tokens (9223372036854775807 or more) exceeds the context length (8192)");
  EXPECT_EQ(check_error([] { check_max_tokens(0, 8, 16, "max_tokens"); }),
            "max_tokens: expected a positive integer, got 0");
  EXPECT_EQ(check_error([] { check_prompt_length(0, 16, "prompt"); }),
            "prompt: the prompt is empty (expected at least one token)");
  EXPECT_NE(check_error([] { check_prompt_length(16, 16, "prompt"); }), "");
  EXPECT_NO_THROW(check_prompt_length(15, 16, "prompt"));
}

TEST(ServeApi, ResponseShapes) {
  RequestOutcome o;
  o.reason = FinishReason::Stop;
  o.prompt_tokens = 5;
  o.completion_tokens = 3;
  o.stats.rounds = 2;
  o.stats.accepted = 1;
  o.stats.drafted = 4;
  const ResponseMeta chat{Endpoint::ChatCompletions, "chatcmpl-1", 123, "m"};
  const auto r = response_json(chat, "hey", o);
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(r["choices"][0]["message"]["content"], "hey");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r["usage"]["total_tokens"], 8);
  EXPECT_DOUBLE_EQ(r["dspark"]["tau"].get<double>(), 1.5);
  EXPECT_EQ(chunk_json(chat, "a")["choices"][0]["delta"]["content"], "a");
  EXPECT_TRUE(chunk_json(chat, "a")["choices"][0]["finish_reason"].is_null());
  EXPECT_EQ(role_chunk_json(chat)["choices"][0]["delta"]["role"], "assistant");
  o.reason = FinishReason::Length;
  EXPECT_EQ(final_chunk_json(chat, o)["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(usage_chunk_json(chat, o)["choices"].empty());

  const ResponseMeta cmpl{Endpoint::Completions, "cmpl-1", 123, "m"};
  EXPECT_EQ(response_json(cmpl, "x", o)["object"], "text_completion");
  EXPECT_EQ(response_json(cmpl, "x", o)["choices"][0]["text"], "x");
  EXPECT_EQ(chunk_json(cmpl, "y")["choices"][0]["text"], "y");
  EXPECT_EQ(sse_event(nlohmann::json{{"a", 1}}), "data: {\"a\":1}\n\n");
  const auto err = error_body("bad", "invalid_request_error", "max_tokens");
  EXPECT_EQ(err["error"]["param"], "max_tokens");
  EXPECT_TRUE(error_body("bad", "invalid_request_error")["error"]["param"].is_null());
}

// ---- API keys and metrics ------------------------------------------------------------

TEST(ServeAuth, KeysAreCheckedAsBearerTokens) {
  EXPECT_TRUE(constant_time_equal("abc", "abc"));
  EXPECT_FALSE(constant_time_equal("abd", "abc"));
  EXPECT_FALSE(constant_time_equal("ab", "abc"));
  EXPECT_FALSE(constant_time_equal("abcabc", "abc"));  // a repeat of the key is not the key
  EXPECT_FALSE(constant_time_equal("", "abc"));
  EXPECT_TRUE(constant_time_equal("", ""));
  ApiKeys none;
  EXPECT_TRUE(none.allows(""));  // no keys: open
  ApiKeys keys;
  keys.add("sk-one");
  keys.add("sk-two");
  EXPECT_TRUE(keys.allows("Bearer sk-one"));
  EXPECT_TRUE(keys.allows("bearer sk-two"));
  EXPECT_TRUE(keys.allows("Bearer  sk-two "));
  EXPECT_FALSE(keys.allows(""));
  EXPECT_FALSE(keys.allows("sk-one"));
  EXPECT_FALSE(keys.allows("Bearer"));
  EXPECT_FALSE(keys.allows("Bearer "));
  EXPECT_FALSE(keys.allows("Bearer sk-on"));
  EXPECT_FALSE(keys.allows("Bearer sk-one2"));
  EXPECT_FALSE(keys.allows("Basic sk-one"));
  EXPECT_THROW(keys.add(""), InvalidArgument);
  EXPECT_THROW(keys.add("has space"), InvalidArgument);
  test::TempDir dir;
  test::write_bytes(dir.file("keys"), "# team keys\n\n  sk-file  \nsk-other\n");
  ApiKeys from_file;
  from_file.add_file(dir.file("keys"));
  EXPECT_EQ(from_file.size(), 2u);
  EXPECT_TRUE(from_file.allows("Bearer sk-file"));
  EXPECT_FALSE(from_file.allows("Bearer # team keys"));
  test::write_bytes(dir.file("empty"), "# nothing\n");
  EXPECT_NE(test::message_of<Error>([&] { ApiKeys().add_file(dir.file("empty")); }).find(dir.file("empty")),
            std::string::npos);
  test::write_bytes(dir.file("bad"), "sk-ok\nsk bad\n");
  EXPECT_NE(test::message_of<Error>([&] { ApiKeys().add_file(dir.file("bad")); }).find(dir.file("bad") + ":2:"),
            std::string::npos);
  for (const char* h : {"127.0.0.1", "127.1.2.3", "::1", "localhost"}) EXPECT_TRUE(is_loopback(h)) << h;
  for (const char* h : {"0.0.0.0", "::", "10.0.0.1", "192.168.1.5", "example.com"}) EXPECT_FALSE(is_loopback(h)) << h;
}

TEST(ServeMetrics, PrometheusTextOfKnownFigures) {
  Histogram h({0.1, 1});
  for (double v : {0.05, 0.1, 0.5, 2.0}) h.observe(v);
  EXPECT_EQ(h.counts(), (std::vector<int64_t>{2, 1, 1}));  // le semantics: 0.1 falls in the 0.1 bucket
  EXPECT_DOUBLE_EQ(h.sum(), 2.65);
  EngineMetrics m;
  m.prompt_tokens = 30;
  m.generated_tokens = 12;
  m.finished["stop"] = 2;
  m.time_to_first_token.observe(0.3);
  m.totals.rounds = 4;
  m.totals.accepted = 6;
  m.totals.drafted = 10;
  m.totals.lookup_rounds = 1;
  m.totals.reached_by_position = {4, 2};
  m.totals.accepted_by_position = {3, 1};
  m.verify_length.observe(3);
  const std::string t = prometheus_text("sm\"ol", true, m, ServerGauges{2, 1, 8, 32},
                                        {{{"/v1/completions", 200}, 3}, {{"/v1/models", 401}, 1}});
  auto has = [&](const std::string& line) {
    EXPECT_NE(t.find("\n" + line + "\n"), std::string::npos) << "missing: " << line << "\n" << t;
  };
  has(R"(dspark_requests_total{model="sm\"ol",route="/v1/completions",status="200"} 3)");
  has(R"(dspark_requests_total{model="sm\"ol",route="/v1/models",status="401"} 1)");
  has(R"(dspark_requests_finished_total{model="sm\"ol",reason="stop"} 2)");
  has(R"(dspark_prompt_tokens_total{model="sm\"ol"} 30)");
  has(R"(dspark_generation_tokens_total{model="sm\"ol"} 12)");
  has(R"(dspark_requests_active{model="sm\"ol"} 2)");
  has(R"(dspark_requests_queued{model="sm\"ol"} 1)");
  has(R"(dspark_slots{model="sm\"ol"} 8)");
  has("# TYPE dspark_time_to_first_token_seconds histogram");
  has(R"(dspark_time_to_first_token_seconds_bucket{model="sm\"ol",le="0.2"} 0)");
  has(R"(dspark_time_to_first_token_seconds_bucket{model="sm\"ol",le="0.3"} 1)");
  has(R"(dspark_time_to_first_token_seconds_bucket{model="sm\"ol",le="+Inf"} 1)");
  has(R"(dspark_time_to_first_token_seconds_count{model="sm\"ol"} 1)");
  has(R"(dspark_spec_tau{model="sm\"ol"} 2.5)");  // (6 + 4) / 4
  has(R"(dspark_spec_acceptance_ratio{model="sm\"ol",position="0"} 0.75)");
  has(R"(dspark_spec_acceptance_ratio{model="sm\"ol",position="1"} 0.5)");
  has(R"(dspark_spec_lookup_share{model="sm\"ol"} 0.25)");
  has(R"(dspark_spec_verify_length_bucket{model="sm\"ol",le="2"} 0)");
  has(R"(dspark_spec_verify_length_bucket{model="sm\"ol",le="3"} 1)");
  has(R"(dspark_spec_draft_tokens_total{model="sm\"ol"} 10)");
  // Every sample line is "name{labels} value", and every name has a TYPE.
  std::istringstream lines(t);
  std::set<std::string> typed;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("# TYPE ", 0) == 0) typed.insert(line.substr(7, line.find(' ', 7) - 7));
    if (line.empty() || line[0] == '#') continue;
    const std::string name = line.substr(0, line.find('{'));
    const bool known = typed.count(name) || typed.count(name.substr(0, name.rfind('_')));
    EXPECT_TRUE(known) << line;
    EXPECT_NE(line.find("} "), std::string::npos) << line;
  }
}

// ---- the engine on a tiny random Llama ----------------------------------------------

class ServeEngine : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new test::TempDir();
    const std::string path = tmp_->file("tiny.gguf");
    test::write_tiny_llama(path, 11);
    model_ = new LoadedModel(LoadedModel::load(path));
    DrafterConfig c;
    c.gamma = 4;
    c.markov_rank = 32;
    c.complete_from(model_->target->info());
    drafter_ = new Drafter(Drafter::init(c, 3));
    drafter_->bind(*model_->target);
  }
  static void TearDownTestSuite() {
    delete drafter_;
    delete model_;
    delete tmp_;
  }

  // Greedy options; `eos` false: only the token budget ends generation.
  static GenerateOptions greedy(int64_t n, bool eos = true) {
    GenerateOptions g;
    g.n_predict = n;
    g.ctx_size = 256;
    g.sampling.temperature = 0;
    if (eos) g.stop_ids = model_->stop_ids;
    return g;
  }
  static std::vector<TokenId> prompt(int i) {
    return model_->tokenizer->encode("the prompt number " + std::to_string(i) + " says hello", false);
  }
  // The text a request of these tokens delivers: streamed, a character the
  // last token leaves unfinished dropped.
  static std::string text_of(const std::vector<TokenId>& tokens) {
    tok::StreamDecoder d(*model_->tokenizer);
    std::string text;
    for (TokenId t : tokens) text += d.push(t);
    d.finish();
    return text;
  }
  // Plain single-request decoding: tokens and their streamed text.
  static std::pair<std::vector<TokenId>, std::string> alone(const std::vector<TokenId>& p, int64_t n) {
    const GenerateResult r = generate_plain(*model_->target, p, greedy(n));
    return {r.tokens, text_of(r.tokens)};
  }

  static test::TempDir* tmp_;
  static LoadedModel* model_;
  static Drafter* drafter_;
};
test::TempDir* ServeEngine::tmp_ = nullptr;
LoadedModel* ServeEngine::model_ = nullptr;
Drafter* ServeEngine::drafter_ = nullptr;

TEST_F(ServeEngine, BatchedOutputEqualsSingleRequestOutput) {
  // Plain, speculative, and speculative with a scheduler (a falling SPS
  // curve, so verify windows are cut) must all reproduce plain decoding.
  std::vector<double> sps;
  for (int b = 1; b <= 64; ++b) sps.push_back(100.0 / (1.0 + 0.05 * b));
  struct Config {
    const DraftModel* drafter;
    std::vector<double> sps;
    int parallel;
  };
  for (const Config& cfg : {Config{nullptr, {}, 4}, Config{drafter_, {}, 4}, Config{drafter_, sps, 3}}) {
    EngineOptions eo;
    eo.parallel = cfg.parallel;
    eo.sps = cfg.sps;
    Engine engine(*model_->target, *model_->tokenizer, cfg.drafter, eo);
    std::vector<std::shared_ptr<Request>> reqs;
    for (int i = 0; i < 7; ++i) reqs.push_back(engine.submit(prompt(i), greedy(10 + i), {}));
    for (int i = 0; i < 7; ++i) {
      const std::string text = reqs[i]->wait();
      const auto [tokens, expected] = alone(prompt(i), 10 + i);
      EXPECT_EQ(text, expected) << "request " << i;
      const RequestOutcome& o = reqs[i]->outcome();
      EXPECT_EQ(o.completion_tokens, static_cast<int64_t>(tokens.size()));
      EXPECT_EQ(o.prompt_tokens, static_cast<int64_t>(prompt(i).size()));
      EXPECT_TRUE(o.reason == FinishReason::Length || o.reason == FinishReason::Stop);
      EXPECT_EQ(o.speculative, cfg.drafter != nullptr);
    }
    const EngineLoad l = engine.load();
    EXPECT_EQ(l.completed, 7);
    EXPECT_EQ(l.active, 0);
    // Seven requests of 10..16 tokens in far fewer calls than one at a time.
    EXPECT_LT(l.steps, 7 * 10);
  }
}

TEST_F(ServeEngine, SeededSamplingIsTheSameTogetherAsAlone) {
  // Seed-stable sampling: a request's text depends on its seed only, not on
  // the drafter, the scheduler's verify lengths or the other requests.
  std::vector<double> sps;
  for (int b = 1; b <= 64; ++b) sps.push_back(100.0 / (1.0 + 0.05 * b));
  auto sampled = [](int64_t n, uint64_t seed) {
    GenerateOptions g = greedy(n, false);
    g.sampling.temperature = 1.0f;
    g.sampling.top_k = 0;
    g.sampling.top_p = 1.0f;
    g.sampling.min_p = 0.0f;
    g.sampling.seed = seed;
    g.sampling.rule = SamplingRule::SeedStable;
    return g;
  };
  for (const DraftModel* d : {static_cast<const DraftModel*>(nullptr), static_cast<const DraftModel*>(drafter_)}) {
    EngineOptions eo;
    eo.parallel = 4;
    eo.sps = sps;
    eo.prefill_budget = 6;
    Engine engine(*model_->target, *model_->tokenizer, d, eo);
    std::vector<std::shared_ptr<Request>> reqs;
    for (int i = 0; i < 6; ++i) reqs.push_back(engine.submit(prompt(i % 2), sampled(12, 1000 + i), {}));
    std::set<std::string> texts;
    for (int i = 0; i < 6; ++i) {
      const std::string text = reqs[i]->wait();
      const GenerateResult ref = generate_plain(*model_->target, prompt(i % 2), sampled(12, 1000 + i));
      const std::string expected = text_of(ref.tokens);
      EXPECT_EQ(text, expected) << "request " << i << (d ? " speculative" : " plain");
      texts.insert(text);
    }
    EXPECT_EQ(texts.size(), 6u);  // distinct seeds, distinct texts
  }
}

// `piece` repeated to exactly `n` tokens.
std::vector<TokenId> repeated(const std::vector<TokenId>& piece, size_t n) {
  std::vector<TokenId> p;
  while (p.size() < n) p.insert(p.end(), piece.begin(), piece.end());
  p.resize(n);
  return p;
}

TEST_F(ServeEngine, ShortRequestIsAnsweredWhileALongPromptIsPrefilled) {
  // The runner's chunked prefill, stepped by hand: a short request that
  // arrives after a long prompt has begun is prefilled first and finished
  // while the long prompt still has most of its prefill ahead.
  SpecSession slow(*model_->target, nullptr, repeated(prompt(3), 200), greedy(4, false));
  SpecSession quick(*model_->target, nullptr, prompt(2), greedy(3, false));
  BatchRunner runner(*model_->target, nullptr, SpecOptions{}, RunnerOptions{8});
  std::vector<SpecSession*> both{&slow};
  runner.step(both);  // the long prompt alone: one chunk within the budget of 8
  const int64_t first_chunk = slow.prefilled_tokens();
  EXPECT_GE(first_chunk, 1);
  EXPECT_LE(first_chunk, 8);
  both.push_back(&quick);
  int steps = 0;
  while (!quick.finished()) {
    runner.step(both);
    ++steps;
  }
  EXPECT_LE(steps, 3 + static_cast<int>(prompt(2).size()) / 8 + 1);
  EXPECT_TRUE(slow.prefilling());
  EXPECT_LT(slow.prefilled_tokens(), 8 + 8 * steps);
  EXPECT_EQ(quick.result().tokens, generate_plain(*model_->target, prompt(2), greedy(3, false)).tokens);
}

// A step time of 10 ms + 1 ms per row: SPS(B) = 1 / (0.010 + 0.001 B),
// given for B = 1..n (beyond, sps_at extrapolates the same line).
std::vector<double> linear_sps(int n) {
  std::vector<double> sps;
  for (int b = 1; b <= n; ++b) sps.push_back(1.0 / (0.010 + 0.001 * b));
  return sps;
}

TEST(TimedPrefillBudget, KeepsTheStepWithinTheSlowdownOfDecodingAlone) {
  const std::vector<double> sps = linear_sps(8);
  // One row decoding: t(1) = 11 ms; within 2.05x, t(1 + P) = 11 + P ms <= 22.55 ms: P = 11
  // (B = 12, past the curve's end).
  EXPECT_EQ(timed_prefill_budget(sps, 1, 2.05, 64), 11);
  // Four rows: t(4) = 14 ms, 14 + P <= 28.7: P = 14.
  EXPECT_EQ(timed_prefill_budget(sps, 4, 2.05, 64), 14);
  // The fixed budget still caps it.
  EXPECT_EQ(timed_prefill_budget(sps, 4, 2.05, 8), 8);
  // No slack at all: nothing but the runner's one token of progress.
  EXPECT_EQ(timed_prefill_budget(sps, 1, 1.0, 64), 0);
  // Nobody decoding, no curve, or the rule off: the fixed budget.
  EXPECT_EQ(timed_prefill_budget(sps, 0, 2.05, 64), 64);
  EXPECT_EQ(timed_prefill_budget({}, 3, 2.05, 64), 64);
  EXPECT_EQ(timed_prefill_budget(sps, 3, 0.0, 64), 64);
  // A noisy curve: a slow point at B = 4 ends the budget although B = 5..8
  // are fast again.
  std::vector<double> noisy = sps;
  noisy[3] = 1.0 / 0.030;
  EXPECT_EQ(timed_prefill_budget(noisy, 1, 2.05, 64), 2);
  EXPECT_THROW(timed_prefill_budget({100.0, 0.0}, 1, 2.0, 64), InvalidArgument);
}

TEST_F(ServeEngine, PrefillBesideDecodingStaysWithinTheTimedBudget) {
  // The runner stepped by hand on the linear curve: while `quick` decodes,
  // each of the long prompt's chunks costs at most 11 row equivalents (one
  // decoding row, slowdown 2.05), or is the one token of progress; before
  // and after, chunks use the fixed budget of 64.
  const std::vector<TokenId> long_prompt = repeated(prompt(3), 240);  // within greedy()'s context of 256
  SpecSession slow(*model_->target, nullptr, long_prompt, greedy(2, false));
  SpecSession quick(*model_->target, nullptr, prompt(2), greedy(6, false));
  BatchRunner runner(*model_->target, nullptr, SpecOptions{}, RunnerOptions{64, linear_sps(8), 2.05});
  const int64_t span = prefill_attention_span(model_->target->info());
  std::vector<SpecSession*> both{&slow};
  runner.step(both);
  EXPECT_GT(prefill_cost(slow.prefilled_tokens() + 1, 0, span), 64.0);  // the chunk filled the fixed budget
  both.push_back(&quick);
  int decoding_steps = 0;
  while (!quick.finished()) {
    const bool decoding = !quick.prefilling();
    const int64_t before = slow.prefilled_tokens();
    runner.step(both);
    const int64_t n = slow.prefilled_tokens() - before;
    if (!decoding) continue;
    ++decoding_steps;
    EXPECT_GE(n, 1);
    if (n > 1) {
      EXPECT_LE(prefill_cost(n, before, span), 11.0) << n << " tokens after " << before;
    }
  }
  EXPECT_GE(decoding_steps, 5);
  EXPECT_TRUE(slow.prefilling());
  EXPECT_EQ(quick.result().tokens, generate_plain(*model_->target, prompt(2), greedy(6, false)).tokens);
}

TEST_F(ServeEngine, LongPromptIsPrefilledInChunksBetweenOtherSteps) {
  // The engine with a prefill budget: both requests as alone, the long
  // prompt over many steps.
  EngineOptions eo;
  eo.parallel = 2;
  eo.prefill_budget = 8;
  Engine engine(*model_->target, *model_->tokenizer, nullptr, eo);
  const std::vector<TokenId> long_prompt = repeated(prompt(3), 200);
  auto slow = engine.submit(long_prompt, greedy(4, false), {});
  auto quick = engine.submit(prompt(2), greedy(3, false), {});
  EXPECT_EQ(quick->wait(), alone(prompt(2), 3).second);
  const std::string slow_text = slow->wait();
  GenerateOptions g = greedy(4, false);
  const GenerateResult ref = generate_plain(*model_->target, long_prompt, g);
  const std::string expected = text_of(ref.tokens);
  EXPECT_EQ(slow_text, expected);
  // 200 prompt tokens at most 8 row equivalents per step: at least 25 steps.
  EXPECT_GE(engine.load().steps, 25);
}

TEST_F(ServeEngine, StopStringsCutTextAndCountTokens) {
  const auto p = prompt(1);
  const auto [tokens, text] = alone(p, 24);
  // A stop string of two whole characters from the text (this model's
  // tokens are mostly single bytes, so it spans several tokens).
  std::vector<size_t> chars;  // offsets where a UTF-8 character starts
  for (size_t i = 0; i < text.size(); ++i)
    if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) chars.push_back(i);
  ASSERT_GE(chars.size(), 4u) << text;
  const std::string stop = text.substr(chars[1], chars[3] - chars[1]);
  const size_t at = text.find(stop);
  // k = the fewest tokens whose text contains the stop string.
  int64_t k = 0;
  for (int64_t n = 1; n <= static_cast<int64_t>(tokens.size()); ++n) {
    tok::StreamDecoder d(*model_->tokenizer);
    std::string t;
    for (int64_t i = 0; i < n; ++i) t += d.push(tokens[static_cast<size_t>(i)]);
    if (t.find(stop) != std::string::npos) {
      k = n;
      break;
    }
  }
  ASSERT_GT(k, 0);
  for (const DraftModel* d : {static_cast<const DraftModel*>(nullptr), static_cast<const DraftModel*>(drafter_)}) {
    Engine engine(*model_->target, *model_->tokenizer, d, EngineOptions{});
    auto r = engine.submit(p, greedy(24), {"never", stop});
    EXPECT_EQ(r->wait(), text.substr(0, at));
    EXPECT_EQ(r->outcome().reason, FinishReason::Stop);
    EXPECT_EQ(r->outcome().completion_tokens, k);
  }
}

TEST_F(ServeEngine, CancelFreesTheSlot) {
  EngineOptions eo;
  eo.parallel = 1;
  Engine engine(*model_->target, *model_->tokenizer, nullptr, eo);
  auto a = engine.submit(prompt(1), greedy(200, false), {});
  auto b = engine.submit(prompt(2), greedy(5, false), {});
  a->cancel();  // long before its 200 tokens
  a->wait();
  EXPECT_EQ(a->outcome().reason, FinishReason::Cancelled);
  EXPECT_LT(a->outcome().completion_tokens, 200);
  auto plain = greedy(5, false);
  const GenerateResult ref = generate_plain(*model_->target, prompt(2), plain);
  const std::string expected = text_of(ref.tokens);
  EXPECT_EQ(b->wait(), expected);
  EXPECT_EQ(b->outcome().completion_tokens, 5);
}

TEST_F(ServeEngine, EndsTheCreatingThreadsWorkers) {
  // Two OpenMP teams on as many threads as cores made every step ~4x
  // slower (ops/compute_threads.hpp): the engine's must be the only one.
  auto os_threads = [] {
    int n = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
    return n;
  };
  const int before = at::get_num_threads();
  at::set_num_threads(3);
  at::parallel_for(0, 64, 1, [](int64_t, int64_t) {});  // this thread's team: 2 workers
  const int with_team = os_threads();
  {
    Engine engine(*model_->target, *model_->tokenizer, nullptr, EngineOptions{});
    EXPECT_LE(os_threads(), with_team - 2 + 1);  // the workers ended; the engine thread started
    auto r = engine.submit(prompt(1), greedy(3, false), {});
    EXPECT_EQ(r->wait(), alone(prompt(1), 3).second);
  }
  at::set_num_threads(before);
}

TEST(TokenLogprobs, HandComputedDistribution) {
  // softmax(0, ln 2, ln 3, ln 2) = (1, 2, 3, 2) / 8; ties by the smaller id.
  const float logits[] = {0.f, std::log(2.f), std::log(3.f), std::log(2.f)};
  const TokenLogprobs t = token_logprobs(logits, 4, 1, 3);
  EXPECT_EQ(t.id, 1);
  EXPECT_NEAR(t.logprob, std::log(2.0 / 8), 1e-6);
  EXPECT_EQ(t.top_ids, (std::vector<TokenId>{2, 1, 3}));
  ASSERT_EQ(t.top_logprobs.size(), 3u);
  EXPECT_NEAR(t.top_logprobs[0], std::log(3.0 / 8), 1e-6);
  EXPECT_EQ(t.top_logprobs[1], t.top_logprobs[2]);
  EXPECT_TRUE(token_logprobs(logits, 4, 0, 0).top_ids.empty());
  const float bad[] = {0.f, std::nanf("")};
  EXPECT_THROW(token_logprobs(bad, 2, 0, 1), Error);
}

TEST_F(ServeEngine, LogprobsOfSpeculativeDecodingEqualPlainDecoding) {
  // The log-probabilities reported for each emitted token are the target's
  // at that position: bitwise those of plain decoding, greedy and sampled,
  // whatever drafted the token and whatever shares the batch.
  auto with_logprobs = [](GenerateOptions g) {
    g.top_logprobs = 4;
    return g;
  };
  GenerateOptions sampled = greedy(14, false);
  sampled.sampling.temperature = 0.9f;
  sampled.sampling.seed = 77;
  sampled.sampling.rule = SamplingRule::SeedStable;
  for (const GenerateOptions& g : {greedy(14, false), sampled}) {
    const GenerateResult ref = generate_plain(*model_->target, prompt(4), with_logprobs(g));
    ASSERT_EQ(ref.logprobs.size(), ref.tokens.size());
    for (const DraftModel* d : {static_cast<const DraftModel*>(nullptr), static_cast<const DraftModel*>(drafter_)}) {
      EngineOptions eo;
      eo.parallel = 3;
      Engine engine(*model_->target, *model_->tokenizer, d, eo);
      auto other = engine.submit(prompt(5), greedy(20, false), {});
      auto r = engine.submit(prompt(4), with_logprobs(g), {});
      std::string text;
      std::vector<TokenLogprob> got;
      while (!r->poll(text, 1s, &got)) {
      }
      other->wait();
      ASSERT_EQ(got.size(), ref.tokens.size()) << (d ? "speculative" : "plain");
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_EQ(got[i].token, model_->tokenizer->token_bytes(ref.tokens[i])) << i;
        EXPECT_EQ(got[i].logprob, ref.logprobs[i].logprob) << i;
        ASSERT_EQ(got[i].top.size(), 4u);
        for (size_t k = 0; k < 4; ++k) {
          EXPECT_EQ(got[i].top[k].first, model_->tokenizer->token_bytes(ref.logprobs[i].top_ids[k])) << i;
          EXPECT_EQ(got[i].top[k].second, ref.logprobs[i].top_logprobs[k]) << i;
        }
      }
      if (g.sampling.greedy()) {  // the emitted token is the most likely one
        for (const TokenLogprob& e : got) EXPECT_EQ(e.logprob, e.top[0].second);
      }
    }
  }
}

TEST_F(ServeEngine, UnreadRequestIsCancelledAndFreesItsSlot) {
  // A request whose text nobody takes (a stream iterator still referenced
  // but no longer consumed) is cancelled and frees the one slot; the next
  // request, whose reader is blocked in wait(), is not cancelled however long
  // its text waits there.
  EngineOptions eo;
  eo.parallel = 1;
  // Short enough that the 240 tokens (a few ms of the tiny model) outlast it.
  eo.unread_timeout = 1ms;
  Engine engine(*model_->target, *model_->tokenizer, nullptr, eo);
  auto abandoned = engine.submit(prompt(1), greedy(240, false), {});
  auto read = engine.submit(prompt(2), greedy(30, false), {});  // queued behind it
  EXPECT_EQ(read->wait(), alone(prompt(2), 30).second);
  EXPECT_EQ(read->outcome().reason, FinishReason::Length);
  EXPECT_EQ(engine.load().active, 0);
  abandoned->wait();
  EXPECT_EQ(abandoned->outcome().reason, FinishReason::Cancelled);
  EXPECT_NE(abandoned->outcome().error.find("not read"), std::string::npos) << abandoned->outcome().error;
  EXPECT_LT(abandoned->outcome().completion_tokens, 240);
}

TEST_F(ServeEngine, WaitQueueIsBounded) {
  EngineOptions eo;
  eo.parallel = 1;
  eo.max_queue = 1;
  Engine engine(*model_->target, *model_->tokenizer, nullptr, eo);
  auto running = engine.submit(prompt(1), greedy(240, false), {});
  auto waiting = engine.submit(prompt(2), greedy(3, false), {});
  // One request waits beyond the one slot: the next is refused, whether or
  // not the engine has admitted the first yet.
  EXPECT_THROW(engine.submit(prompt(3), greedy(3, false), {}), QueueFull);
  EXPECT_TRUE(engine.load().full());
  // Several prompts of one request are queued all together or not at all:
  // three could never be taken by one slot and one place in the queue (an
  // invalid request, not a busy server), two do not fit now.
  const auto several = [&](int n) {
    std::vector<Engine::Submission> subs;
    for (int i = 0; i < n; ++i) subs.push_back({prompt(4 + i), greedy(3, false)});
    return subs;
  };
  try {
    engine.submit_all(several(3), {});
    ADD_FAILURE() << "3 prompts accepted by 1 slot + 1 queue place";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(),
                 "the request holds 3 prompts, but this server takes at most 2 at once (--parallel 1 + --max-queue 1)");
  }
  EXPECT_THROW(engine.submit_all(several(2), {}), QueueFull);
  EXPECT_EQ(engine.load().queued + engine.load().active, 2);  // nothing of either was queued
  running->cancel();
  EXPECT_EQ(waiting->wait(), alone(prompt(2), 3).second);
  EXPECT_FALSE(engine.load().full());
  auto later = engine.submit(prompt(3), greedy(3, false), {});
  EXPECT_EQ(later->wait(), alone(prompt(3), 3).second);
  auto both = engine.submit_all(several(2), {});
  ASSERT_EQ(both.size(), 2u);
  EXPECT_EQ(both[0]->wait(), alone(prompt(4), 3).second);
  EXPECT_EQ(both[1]->wait(), alone(prompt(5), 3).second);
  EngineOptions negative;
  negative.max_queue = -1;
  EXPECT_THROW(Engine(*model_->target, *model_->tokenizer, nullptr, negative), InvalidArgument);
}

TEST_F(ServeEngine, DeadlinesEndQueuedAndRunningRequests) {
  EngineOptions eo;
  eo.parallel = 1;
  Engine engine(*model_->target, *model_->tokenizer, nullptr, eo);
  // Running: ends at its deadline with the text so far (a prefix of the
  // text it would have produced). Whether 240 tokens of this tiny model fit
  // in a deadline depends on the machine: shorter deadlines until one ends a
  // request that had begun.
  int64_t deadlines = 0;
  bool ended_running = false;
  for (const auto d : {30000us, 10000us, 3000us, 1000us, 300us}) {
    auto running = engine.submit(prompt(1), greedy(240, false), {}, std::chrono::steady_clock::now() + d);
    const std::string text = running->wait();
    const RequestOutcome& o = running->outcome();
    if (o.reason != FinishReason::Deadline) continue;
    ++deadlines;
    if (!o.admitted) continue;
    ended_running = true;
    EXPECT_LT(o.completion_tokens, 240);
    EXPECT_EQ(alone(prompt(1), 240).second.rfind(text, 0), 0u);
    break;
  }
  EXPECT_TRUE(ended_running) << "no deadline ended a running request";
  // Queued with a deadline that has passed: never gets the slot.
  auto queued = engine.submit(prompt(2), greedy(3, false), {}, std::chrono::steady_clock::now() - 1ms);
  queued->wait();
  EXPECT_EQ(queued->outcome().reason, FinishReason::Deadline);
  EXPECT_FALSE(queued->outcome().admitted);
  EXPECT_EQ(queued->outcome().completion_tokens, 0);
  const EngineMetrics m = engine.metrics();
  EXPECT_EQ(m.finished.at("deadline"), deadlines + 1);
}

TEST_F(ServeEngine, MetricsCountWhatRequestsDid) {
  EngineOptions eo;
  eo.parallel = 3;
  Engine engine(*model_->target, *model_->tokenizer, drafter_, eo);
  std::vector<std::shared_ptr<Request>> reqs;
  for (int i = 0; i < 3; ++i) reqs.push_back(engine.submit(prompt(i), greedy(6 + i, false), {}));
  int64_t tokens = 0, prompts = 0;
  GenerateStats spec;
  for (auto& r : reqs) {
    r->wait();
    tokens += r->outcome().completion_tokens;
    prompts += r->outcome().prompt_tokens;
    spec += r->outcome().stats;
  }
  const EngineMetrics m = engine.metrics();
  EXPECT_EQ(tokens, 6 + 7 + 8);
  EXPECT_EQ(m.generated_tokens, tokens);
  EXPECT_EQ(m.prompt_tokens, prompts);
  EXPECT_EQ(m.finished.at("length"), 3);
  EXPECT_EQ(m.time_to_first_token.count(), 3);
  EXPECT_EQ(m.time_per_output_token.count(), tokens - 3);  // intervals between a request's tokens
  EXPECT_EQ(m.queue_time.count(), 3);
  EXPECT_EQ(m.totals.rounds, spec.rounds);
  EXPECT_EQ(m.totals.accepted, spec.accepted);
  EXPECT_EQ(m.verify_length.count(), spec.rounds);  // one observation per round
  EXPECT_DOUBLE_EQ(m.verify_length.sum(), static_cast<double>(spec.drafted));
  EXPECT_EQ(m.steps, engine.load().steps);
}

TEST_F(ServeEngine, ShutdownEndsEveryRequest) {
  EngineOptions eo;
  eo.parallel = 1;
  Engine engine(*model_->target, *model_->tokenizer, drafter_, eo);
  auto a = engine.submit(prompt(1), greedy(200, false), {});
  auto b = engine.submit(prompt(2), greedy(200, false), {});
  engine.shutdown();
  a->wait();
  b->wait();
  EXPECT_EQ(b->outcome().reason, FinishReason::Cancelled);
  EXPECT_THROW(engine.submit(prompt(3), greedy(5), {}), Error);
  engine.shutdown();  // idempotent
}

TEST_F(ServeEngine, SubmitValidates) {
  Engine engine(*model_->target, *model_->tokenizer, nullptr, EngineOptions{});
  EXPECT_THROW(engine.submit({}, greedy(5), {}), InvalidArgument);
  EXPECT_THROW(engine.submit(std::vector<TokenId>(300, 5), greedy(5), {}), InvalidArgument);
  auto bad = greedy(5);
  bad.sampling.temperature = 1;
  bad.sampling.top_p = 0;
  EXPECT_THROW(engine.submit(prompt(1), bad, {}), InvalidArgument);
  EngineOptions none;
  none.parallel = 0;
  EXPECT_THROW(Engine(*model_->target, *model_->tokenizer, nullptr, none), InvalidArgument);
}

// ---- the server with the official openai client (real model) -------------------------

// The OPENAI_PIP pin of scripts/versions.env ("openai==X.Y.Z").
std::string openai_pin() {
  std::ifstream f(DSPARK_SOURCE_DIR "/scripts/versions.env");
  std::string line;
  const std::regex re(R"(^OPENAI_PIP=\"?([^\"]+)\"?\s*$)");
  std::smatch m;
  while (std::getline(f, line))
    if (std::regex_match(line, m, re)) return m[1];
  return "";
}

// Makes `import openai` work, installing the pinned client when missing.
bool ensure_openai_client(std::string& why) {
  if (std::system("python3 -c 'import openai' >/dev/null 2>&1") == 0) return true;
  const std::string pin = openai_pin();
  if (pin.empty()) {
    why = "OPENAI_PIP is missing from scripts/versions.env";
    return false;
  }
  const std::string cmd = "python3 -m pip install --quiet '" + pin + "' >/dev/null 2>&1 || python3 -m pip install --quiet --break-system-packages '" + pin + "' >/dev/null 2>&1";
  if (std::system(cmd.c_str()) != 0 || std::system("python3 -c 'import openai' >/dev/null 2>&1") != 0) {
    why = "cannot install the openai client (" + cmd + ")";
    return false;
  }
  return true;
}

// GET /health on 127.0.0.1:port; true on HTTP 200.
// GET /health on 127.0.0.1:port: the whole response ("" when none came).
std::string get_health(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string reply;
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    const std::string req = "GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    if (::send(fd, req.data(), req.size(), 0) == static_cast<ssize_t>(req.size())) {
      char buf[1024];
      for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) reply.append(buf, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  return reply;
}

// GET /health answers 200 (the server is ready).
bool health_ok(int port) { return get_health(port).rfind("HTTP/1.1 200", 0) == 0; }

// A `dspark serve` child process on a free port, stopped with SIGTERM.
class ServerProcess {
 public:
  ServerProcess(const std::vector<std::string>& args, const std::string& log) : log_(log) {
    std::vector<std::string> argv = {DSPARK_BINARY, "serve", "--port", "0", "--host", "127.0.0.1"};
    argv.insert(argv.end(), args.begin(), args.end());
    // The log is emptied here, before the child exists: wait_ready must never
    // read an earlier server's "listening on" line (and its port).
    std::ofstream(log, std::ios::trunc).close();
    pid_ = ::fork();
    if (pid_ == 0) {
      const int fd = ::open(log.c_str(), O_WRONLY | O_APPEND);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      std::vector<char*> cargv;
      for (auto& a : argv) cargv.push_back(a.data());
      cargv.push_back(nullptr);
      ::execv(cargv[0], cargv.data());
      ::_exit(127);
    }
  }
  ~ServerProcess() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }

  // Waits for the "listening on http://127.0.0.1:PORT" line and a healthy
  // /health; returns the port, or -1 (with the log in `why`).
  int wait_ready(std::string& why) {
    const std::regex re(R"(listening on http://[^:]+:(\d+))");
    for (int i = 0; i < 9000 * test::slowdown(); ++i) {  // up to 180 s (model load on a busy machine)
      std::smatch m;
      const std::string text = log();
      if (port_ < 0 && std::regex_search(text, m, re)) port_ = std::stoi(m[1]);
      if (port_ > 0 && health_ok(port_)) return port_;
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        reaped_ = true;
        why = "the server exited early:\n" + text;
        return -1;
      }
      std::this_thread::sleep_for(20ms);
    }
    why = "the server did not become ready:\n" + log();
    return -1;
  }

  // SIGTERM, then the exit status (-1: had to be killed).
  int stop() {
    ::kill(pid_, SIGTERM);
    for (int i = 0; i < 1500 * test::slowdown(); ++i) {  // up to 30 s
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        reaped_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(20ms);
    }
    return -1;
  }

  pid_t pid() const { return pid_; }
  // The port from the "listening on" line once it is there (-1 before).
  int port() {
    const std::regex re(R"(listening on http://[^:]+:(\d+))");
    std::smatch m;
    const std::string text = log();
    if (port_ < 0 && std::regex_search(text, m, re)) port_ = std::stoi(m[1]);
    return port_;
  }

  std::string log() const {
    std::ifstream f(log_);
    return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }

 private:
  std::string log_;
  pid_t pid_ = -1;
  int port_ = -1;
  bool reaped_ = false;
};

class ServeOpenAI : public ::testing::Test {
 protected:
  void SetUp() override {
    DSPARK_REQUIRE_MODEL();
    std::string why;
    if (!ensure_openai_client(why)) FAIL() << why;
  }

  // Starts a server with `args`, runs the client checks of `suite`, stops
  // the server with SIGTERM and expects a clean exit.
  // Starts a server with `args`, runs the client checks of `suite` (with
  // `client_args`; "{pid}" becomes the server's process id), stops the
  // server with SIGTERM and expects a clean exit.
  void run_suite(const std::vector<std::string>& args, const std::string& suite, const std::string& only = "",
                 std::string client_args = "") {
    ServerProcess server(args, tmp_.file("server" + std::to_string(servers_++) + ".log"));
    if (const size_t at = client_args.find("{pid}"); at != std::string::npos)
      client_args.replace(at, 5, std::to_string(server.pid()));
    std::string why;
    const int port = server.wait_ready(why);
    ASSERT_GT(port, 0) << why;
    // A second server on the same port is refused, not let in to share it
    // (checked once per test process: each check starts a whole server).
    static bool second_checked = false;
    if (!std::exchange(second_checked, true)) expect_port_refused(port);
    const std::string out = tmp_.file("client.out");
    std::string cmd = "python3 " DSPARK_SOURCE_DIR "/tests/serve/test_openai_client.py --base-url http://127.0.0.1:" +
                      std::to_string(port) + " --suite " + suite;
    if (!only.empty()) cmd += " -k " + only;
    if (!client_args.empty()) cmd += " " + client_args;
    const int rc = std::system((cmd + " >" + out + " 2>&1").c_str());
    std::ifstream f(out);
    const std::string client((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    EXPECT_EQ(rc, 0) << client << "\n--- server log ---\n" << server.log();
    std::cout << client;
    EXPECT_EQ(server.stop(), 0) << "no clean exit on SIGTERM:\n" << server.log();
  }

  void expect_port_refused(int port) {
    const std::string second = "timeout " + std::to_string(60 * test::slowdown()) + " " + std::string(DSPARK_BINARY) +
                               " serve -m smollm2 --drafter none --host 127.0.0.1 --port " + std::to_string(port) +
                               " >" + tmp_.file("second.log") + " 2>&1";
    const int rc2 = std::system(second.c_str());
    EXPECT_TRUE(WIFEXITED(rc2) && WEXITSTATUS(rc2) == 2) << test::read_bytes(tmp_.file("second.log"));
  }

  test::TempDir tmp_;
  int servers_ = 0;
};

TEST_F(ServeOpenAI, PlainDecoding) {
  run_suite({"-m", "smollm2", "--drafter", "none", "--parallel", "8", "-t", "2", "-c", "2048"}, "full");
}

TEST_F(ServeOpenAI, RandomDrafterScheduled) {
  const std::string dir = tmp_.file("drafter");
  const std::string init = std::string(DSPARK_BINARY) + " init-drafter -m smollm2 --gamma 4 --out " + dir +
                           " >" + tmp_.file("init.log") + " 2>&1";
  ASSERT_EQ(std::system(init.c_str()), 0) << test::read_bytes(tmp_.file("init.log"));
  // An SPS profile whose step time grows with B: the prefix scheduler picks
  // the verify lengths and shortens them as more requests share a step.
  nlohmann::json profile = {{"model", "smollm2"}, {"threads", 2}, {"b", nlohmann::json::array()},
                            {"sps", nlohmann::json::array()}};
  for (int b = 1; b <= 40; ++b) {
    profile["b"].push_back(b);
    profile["sps"].push_back(20.0 / (1.0 + 0.08 * (b - 1)));
  }
  test::write_bytes(tmp_.file("sps.json"), profile.dump());
  run_suite({"-m", "smollm2", "--drafter", dir, "--sps", tmp_.file("sps.json"), "--parallel", "8", "-t", "2",
             "-c", "2048"},
            "full");
}

TEST_F(ServeOpenAI, SeededSamplingIsBatchIndependent) {
  // Default options (the shipped drafter, the scheduler on this machine's
  // SPS profile — measured here on first use, as `generate` does) and plain
  // decoding.
  const std::string gen = std::string(DSPARK_BINARY) + " generate -m smollm2 -p hi -n 2 --temp 0 >" +
                          tmp_.file("profile.log") + " 2>&1";
  ASSERT_EQ(std::system(gen.c_str()), 0) << test::read_bytes(tmp_.file("profile.log"));
  run_suite({"-m", "smollm2", "-t", "2"}, "seeds");
  run_suite({"-m", "smollm2", "--drafter", "none", "-t", "2"}, "seeds");
}

TEST_F(ServeOpenAI, LogprobsEqualSpeculativeAndPlain) {
  // The same requests' log-probabilities from a plain server and from one
  // with the shipped drafter and prompt-lookup drafts, verifying every
  // drafted position (--sps none, so drafts are verified whatever this
  // machine's profile says): exactly equal.
  const std::string file = "--logprobs-file " + tmp_.file("logprobs.json");
  run_suite({"-m", "smollm2", "--drafter", "none", "-t", "2"}, "logprobs", "", file);
  run_suite({"-m", "smollm2", "-t", "2", "--sps", "none"}, "logprobs", "", file);
}

TEST_F(ServeOpenAI, ApiKeysGuardEveryModelRoute) {
  const std::string keys = tmp_.file("keys.txt");
  test::write_bytes(keys, "# one per line\nsk-test-file\n");
  run_suite({"-m", "smollm2", "--drafter", "none", "-t", "2", "--api-key", "sk-test-one", "--api-key-file", keys},
            "auth");
}

TEST_F(ServeOpenAI, WarnsWhenListeningBeyondLoopbackWithoutAKey) {
  // The warning comes before the model loads (this one does not exist).
  for (const bool with_key : {false, true}) {
    const std::string log = tmp_.file("beyond.log");
    const std::string cmd = std::string(DSPARK_BINARY) + " serve -m " + tmp_.file("missing.gguf") +
                            " --host 0.0.0.0 --port 0" + (with_key ? " --api-key sk-x" : "") + " >" + log + " 2>&1";
    const int rc = std::system(cmd.c_str());
    EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 2) << test::read_bytes(log);
    EXPECT_EQ(test::read_bytes(log).find("warning: listening on 0.0.0.0 without an API key") != std::string::npos,
              !with_key)
        << test::read_bytes(log);
  }
}

TEST_F(ServeOpenAI, MetricsQueueBoundAndDeadlines) {
  run_suite({"-m", "smollm2", "--drafter", "none", "--parallel", "1", "--max-queue", "1", "-t", "2"}, "ops");
}

TEST_F(ServeOpenAI, HealthSaysLoadingThenReady) {
  // From the moment it listens until the model is attached /health answers
  // 503 "loading", then 200 "ready"; never anything else in between.
  ServerProcess server({"-m", "smollm2", "-t", "2", "--drafter", "none"}, tmp_.file("loading.log"));
  std::vector<std::string> seen;
  for (int i = 0; i < 3000 * test::slowdown() && (seen.empty() || seen.back() != "200 ready"); ++i) {
    if (server.port() < 0) {
      std::this_thread::sleep_for(5ms);
      continue;
    }
    const std::string reply = get_health(server.port());
    std::smatch m;
    if (std::regex_search(reply, m, std::regex(R"re(^HTTP/1.1 (\d+)[\s\S]*"status":"([a-z ]+)")re"))) {
      const std::string answer = m[1].str() + " " + m[2].str();
      if (seen.empty() || seen.back() != answer) seen.push_back(answer);
    }
    std::this_thread::sleep_for(5ms);
  }
  ASSERT_FALSE(seen.empty()) << server.log();
  EXPECT_EQ(seen.back(), "200 ready") << server.log();
  for (size_t i = 0; i + 1 < seen.size(); ++i) EXPECT_EQ(seen[i], "503 loading");
  std::cout << "health answers seen: " << seen.size() << " (" << seen.front() << " first)\n";
  EXPECT_EQ(server.stop(), 0) << server.log();
}

TEST_F(ServeOpenAI, SigtermMidStreamFinishesThenExitsZero) {
  // Within --shutdown-timeout the stream ends normally; beyond it, with an
  // error event; [DONE] and exit status 0 either way (run_suite's stop()
  // finds the process already exited).
  run_suite({"-m", "smollm2", "--drafter", "none", "-t", "2", "--shutdown-timeout", "300"}, "shutdown", "",
            "--pid {pid}");
  run_suite({"-m", "smollm2", "--drafter", "none", "-t", "2", "--shutdown-timeout", "1"}, "shutdown", "",
            "--pid {pid} --expect-cancel");
}

TEST_F(ServeOpenAI, ClientDisconnectFreesSlot) {
  run_suite({"-m", "smollm2", "--drafter", "none", "--parallel", "1", "-t", "2", "-c", "8192"}, "disconnect");
}

TEST_F(ServeOpenAI, IdleConnectionsDoNotStarveOtherClients) {
  // Each connection holds an HTTP thread until the library's 5 s read
  // timeout; 200 that send nothing must not queue /health behind them.
  ServerProcess server({"-m", "smollm2", "-t", "2", "--drafter", "none", "--http-threads", "2"},
                       tmp_.file("idle.log"));
  std::string why;
  const int port = server.wait_ready(why);
  ASSERT_GT(port, 0) << why;
  std::vector<int> idle;
  for (int i = 0; i < 200; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    idle.push_back(fd);
  }
  std::this_thread::sleep_for(200ms);  // the server has accepted them
  const auto t0 = std::chrono::steady_clock::now();
  const std::string reply = get_health(port);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << reply;
  // With a fixed pool of 2 threads the answer would wait for 100 read timeouts.
  EXPECT_LT(s, 4.0) << "/health waited behind idle connections";
  for (int fd : idle) ::close(fd);
  EXPECT_EQ(server.stop(), 0) << server.log();
}

}  // namespace
}  // namespace dspark::serve
