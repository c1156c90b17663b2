// The SentencePiece tokenizer on the real Gemma 3 270M vocabulary against
// tests/golden/gemma_tokenizer.jsonl (scripts/golden/make_gemma_tokenizer_golden.py):
// llama.cpp's ids for 458 texts — unicode, emoji, whitespace runs, digits,
// code, Gemma's markers and HTML-like user-defined tokens, with special tokens
// parsed and not — which HF `tokenizers`, built from the same GGUF, also
// reproduces (the file lists its ids wherever it differs).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>
#include <vector>

#include "dspark/io/gguf.hpp"
#include "dspark/tokenizer/tokenizer.hpp"
#include "test_util.hpp"

namespace {

using dspark::tok::TokenId;

TEST(GemmaTokenizer, MatchesLlamaCppAndHfTokenizers) {
  DSPARK_REQUIRE_GEMMA();
  const dspark::io::GGUFFile file(dspark::test::gemma_model_path());
  const auto tok = dspark::tok::Tokenizer::from_gguf(file);
  std::ifstream in(DSPARK_SOURCE_DIR "/tests/golden/gemma_tokenizer.jsonl");
  ASSERT_TRUE(in) << "missing golden file";
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  const auto header = nlohmann::json::parse(line);
  EXPECT_EQ(header.at("model_sha256").get<std::string>(),
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818");
  size_t cases = 0, agree = 0, hf_cases = 0, hf_agree = 0, round_trips = 0;
  while (std::getline(in, line)) {
    const auto c = nlohmann::json::parse(line);
    const std::string name = c.at("name"), text = c.at("text");
    const bool parse = c.at("parse_special");
    const auto ours = tok.encode(text, parse);
    const auto want = c.at("ids").get<std::vector<TokenId>>();
    ++cases;
    agree += ours == want;
    EXPECT_EQ(ours, want) << name << " (parse_special " << parse << ")";
    const auto hf = c.contains("hf_ids") ? c.at("hf_ids").get<std::vector<TokenId>>() : want;
    ++hf_cases;
    hf_agree += ours == hf;
    // Byte fallback makes every text round-trip.
    round_trips += tok.decode(ours) == text;
    EXPECT_EQ(tok.decode(ours), text) << name;
  }
  EXPECT_EQ(cases, header.at("cases").get<size_t>());
  EXPECT_GT(cases, 400u);
  std::printf("[gemma tokenizer] %zu/%zu texts identical to llama.cpp, %zu/%zu to HF tokenizers, %zu round trips\n",
              agree, cases, hf_agree, hf_cases, round_trips);
}

}  // namespace
