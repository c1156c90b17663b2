// SentencePiece-style tokenization (tokenizer.ggml.model = "llama") on the
// tiny Gemma-layout vocabulary of test_util.hpp: merging by score with ties to
// the left, byte fallback, "▁" spaces, the optional space prefix, user-defined
// tokens split out even without special-token parsing, decoding; and the
// Gemma chat format. Ids: 264 "▁", 265 t, 266 h, 267 e, 268 a, 269 s, 270 i,
// 271 "▁t", 272 he, 273 "▁the", 274 is, 275 "▁is", 276 "▁a", 277 st,
// 278 "▁▁", 279 "é"; byte b is 8 + b.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dspark/error.hpp"
#include "dspark/io/gguf.hpp"
#include "dspark/model/loaded_model.hpp"
#include "dspark/tokenizer/chat_template.hpp"
#include "dspark/tokenizer/tokenizer.hpp"
#include "test_util.hpp"

namespace {

using dspark::tok::ChatTemplate;
using dspark::tok::Tokenizer;
using dspark::tok::TokenId;
using Ids = std::vector<TokenId>;
namespace g = dspark::io::gguf;

constexpr TokenId B = dspark::test::kTinySpmByteBase;

struct Spm {
  dspark::test::TempDir dir;
  std::unique_ptr<dspark::io::GGUFFile> file;
  std::unique_ptr<Tokenizer> tok;
  explicit Spm(bool space_prefix = false, const std::string& chat_template = "") {
    dspark::io::GGUFWriter w(3);
    w.set("general.architecture", g::string("gemma3"));
    dspark::test::set_tiny_spm_tokenizer(w);
    if (space_prefix) w.set("tokenizer.ggml.add_space_prefix", g::boolean(true));
    if (!chat_template.empty()) w.set("tokenizer.chat_template", g::string(chat_template));
    const std::string path = dir.file("spm.gguf");
    w.write(path);
    file = std::make_unique<dspark::io::GGUFFile>(path);
    tok = std::make_unique<Tokenizer>(Tokenizer::from_gguf(*file));
  }
};

TEST(SpmTokenizer, MergesHighestScoreFirstTiesToTheLeft) {
  Spm s;
  const Tokenizer& t = *s.tok;
  EXPECT_EQ(t.encode(" the", false), (Ids{273}));
  EXPECT_EQ(t.encode("the", false), (Ids{265, 272})) << "no space prefix (Gemma)";
  // "▁t" (-3) merges before the leftmost "▁▁" (-10), then "he", then "▁the".
  EXPECT_EQ(t.encode("  the", false), (Ids{264, 273}));
  // Two "is" of equal score: the left one first; the right one then joins "▁".
  EXPECT_EQ(t.encode("this is", false), (Ids{265, 266, 274, 275}));
  EXPECT_EQ(t.encode("ist", false), (Ids{274, 265})) << "is (-6) beats st (-9)";
}

TEST(SpmTokenizer, ByteFallbackAndDecoding) {
  Spm s;
  const Tokenizer& t = *s.tok;
  EXPECT_EQ(t.encode("x", false), (Ids{B + 'x'}));
  EXPECT_EQ(t.encode("\xC3\xA9", false), (Ids{279})) << "é is a piece";
  EXPECT_EQ(t.encode("\xC3\xBC", false), (Ids{B + 0xC3, B + 0xBC})) << "ü is not: its bytes";
  EXPECT_EQ(t.encode("\xF0\x9F\x99\x82", false), (Ids{B + 0xF0, B + 0x9F, B + 0x99, B + 0x82})) << "emoji";
  EXPECT_EQ(t.decode({273, 265, B + 0xC3, B + 0xBC}), " thet\xC3\xBC");
  EXPECT_EQ(t.token_bytes(264), " ");
  EXPECT_EQ(t.token_bytes(B + 'A'), "A");
  EXPECT_EQ(t.token_bytes(4), "<start_of_turn>");
  for (const std::string text : {"the cat is here", "  two  spaces\tand tabs\n\nnew\n\n\nlines", "x = 1234;",
                                 "caf\xC3\xA9 \xF0\x9F\x98\x80 \xE4\xB8\xAD\xE6\x96\x87", " leading", "trailing "})
    EXPECT_EQ(t.decode(t.encode(text, false)), text) << text;
}

// Ill-formed UTF-8 falls back to bytes without swallowing the next
// character: a stray lead byte before a space keeps the space's "▁" whole
// (found by fuzzing: judged by the lead byte alone, E2 96 + "▁" became the
// symbols E2 96 E2 | 96 | 81 and decoded as a literal "▁").
TEST(SpmTokenizer, IllFormedUtf8KeepsTheNextCharacterWhole) {
  Spm s;
  const Tokenizer& t = *s.tok;
  EXPECT_EQ(t.encode("a\xE2\x96 the", false), (Ids{268, B + 0xE2, B + 0x96, 273}));
  EXPECT_EQ(t.encode("\xFF the", false), (Ids{B + 0xFF, 273}));
  EXPECT_EQ(t.encode("\xC3 is", false), (Ids{B + 0xC3, 275})) << "truncated 2-byte sequence";
  for (const std::string text : {"a\xE2\x96 the", "\xFF\xFE x", "\xF0\x9F the\xF0", "\x80\x80 is"})
    EXPECT_EQ(t.decode(t.encode(text, false)), text);
}

TEST(SpmTokenizer, UserDefinedTokensAlwaysSplitControlOnlyWhenParsed) {
  Spm s;
  const Tokenizer& t = *s.tok;
  EXPECT_EQ(t.encode("a\n\nb", false), (Ids{268, 7, B + 'b'}));
  EXPECT_EQ(t.encode("\n\n\n", false), (Ids{7, 6})) << "the longest token first";
  EXPECT_EQ(t.encode("<start_of_turn>a", true), (Ids{4, 268}));
  const Ids literal = t.encode("<start_of_turn>a", false);
  EXPECT_EQ(literal.front(), B + '<') << "control token text stays text without special parsing";
  EXPECT_EQ(t.decode(literal), "<start_of_turn>a");
}

TEST(SpmTokenizer, SpacePrefixAtStartAndAfterSpecialTokens) {
  Spm s(/*space_prefix=*/true);
  const Tokenizer& t = *s.tok;
  EXPECT_EQ(t.encode("the", false), (Ids{273}));
  EXPECT_EQ(t.encode("<start_of_turn>the", true), (Ids{4, 273}));
  EXPECT_EQ(t.encode("a the", false), (Ids{276, 273}));
}

TEST(SpmTokenizer, SpecialsAndErrors) {
  Spm s;
  const auto& sp = s.tok->specials();
  EXPECT_EQ(sp.bos, 2);
  EXPECT_EQ(sp.eos, 1);
  EXPECT_EQ(sp.unk, 3);
  EXPECT_TRUE(sp.add_bos);
  EXPECT_EQ(s.tok->vocab_size(), dspark::test::tiny_spm_vocab_size());

  dspark::io::GGUFWriter w(3);
  dspark::test::set_tiny_spm_tokenizer(w);
  w.set("tokenizer.ggml.scores", g::f32_array({0.f, 1.f}));
  dspark::test::TempDir dir;
  w.write(dir.file("bad.gguf"));
  dspark::io::GGUFFile f(dir.file("bad.gguf"));
  try {
    Tokenizer::from_gguf(f);
    FAIL() << "accepted";
  } catch (const dspark::FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.ggml.scores has 2 entries"), std::string::npos) << e.what();
  }
}

// The Gemma 3 chat template (as in google/gemma-3-*-it's tokenizer_config.json).
const char* kGemmaTemplate =
    "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}{%- set first_user_prefix = messages[0]['content'] + "
    "'\\n\\n' -%}{%- set loop_messages = messages[1:] -%}{%- else -%}{%- set first_user_prefix = \"\" -%}{%- set "
    "loop_messages = messages -%}{%- endif -%}{%- for message in loop_messages -%}{%- if (message['role'] == 'user') "
    "!= (loop.index0 % 2 == 0) -%}{{ raise_exception(\"Conversation roles must alternate "
    "user/assistant/user/assistant/...\") }}{%- endif -%}{%- if (message['role'] == 'assistant') -%}{%- set role = "
    "\"model\" -%}{%- else -%}{%- set role = message['role'] -%}{%- endif -%}{{ '<start_of_turn>' + role + '\\n' + "
    "(first_user_prefix if loop.first else \"\") }}{{ message['content'] | trim }}{{ '<end_of_turn>\\n' }}{%- endfor "
    "-%}{%- if add_generation_prompt -%}{{'<start_of_turn>model\\n'}}{%- endif -%}";

TEST(GemmaChat, RendersTurnsAsTheTemplate) {
  Spm s(false, kGemmaTemplate);
  const ChatTemplate ct = ChatTemplate::from_gguf(*s.file, *s.tok);
  EXPECT_EQ(ct.format(), dspark::tok::ChatFormat::Gemma);
  EXPECT_EQ(ct.end_of_turn(), 5);
  EXPECT_FALSE(ct.default_system_prompt().has_value());
  EXPECT_EQ(ct.render({{"user", "hi"}}, true), "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n");
  const std::vector<dspark::tok::ChatMessage> conv = {
      {"system", "Be brief."}, {"user", "  the cat \n"}, {"assistant", "is"}, {"user", "a test"}};
  const std::string want =
      "<start_of_turn>user\nBe brief.\n\nthe cat<end_of_turn>\n<start_of_turn>model\nis<end_of_turn>\n"
      "<start_of_turn>user\na test<end_of_turn>\n<start_of_turn>model\n";
  EXPECT_EQ(ct.render(conv, true), want);
  Ids expect = {2};
  const Ids body = s.tok->encode(want, true);
  expect.insert(expect.end(), body.begin(), body.end());
  EXPECT_EQ(ct.apply(conv, true), expect) << "BOS, then the rendered text with its markers parsed";
  EXPECT_THROW(ct.apply({{"user", "a"}, {"user", "b"}}, true), dspark::InvalidArgument);
  EXPECT_THROW(ct.apply({{"assistant", "a"}}, true), dspark::InvalidArgument);
  EXPECT_THROW(ct.apply({{"user", "a"}, {"system", "b"}}, true), dspark::InvalidArgument);
}

// A base model (no chat template): --chat is a clear error, plain prompts
// get BOS and their tokens.
TEST(GemmaChat, BaseModelRefusesChatAndCompletesPlainText) {
  dspark::test::TempDir dir;
  const std::string path = dir.file("base.gguf");
  dspark::test::write_tiny_gemma(path, 1);
  const dspark::LoadedModel m = dspark::LoadedModel::load(path);
  EXPECT_FALSE(m.chat.has_value());
  try {
    m.encode_prompt("hi", true);
    FAIL() << "chat accepted";
  } catch (const dspark::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("declares no chat template"), std::string::npos) << msg;
    EXPECT_NE(msg.find("run without --chat"), std::string::npos) << msg;
  }
  EXPECT_EQ(m.encode_prompt(" the", false), (Ids{2, 273}));
  EXPECT_EQ(m.stop_ids, (Ids{1}));
}

}  // namespace
