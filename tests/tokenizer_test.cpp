// Tokenizer and chat-template tests.
//
// The parity tests replay tests/golden/tokenizer_strings.jsonl, written by
// scripts/golden/make_tokenizer_golden.py from the Hugging Face `tokenizers`
// library configured with the same GGUF vocabulary, merges and pre-tokenizer.
// They need the real SmolLM2 GGUF file and fail (never skip) without it.
// The remaining tests build tiny GGUF files on the fly to pin down the merge
// order and the error paths.
#include "dspark/tokenizer/tokenizer.hpp"

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "dspark/error.hpp"
#include "dspark/io/gguf.hpp"
#include "dspark/tokenizer/chat_template.hpp"

namespace {

using dspark::FormatError;
using dspark::InvalidArgument;
using dspark::io::GGUFFile;
using dspark::tok::ChatMessage;
using dspark::tok::ChatTemplate;
using dspark::tok::StreamDecoder;
using dspark::tok::TokenId;
using dspark::tok::Tokenizer;
using dspark::tok::TokenType;
using json = nlohmann::json;

constexpr const char* kModelFile = "SmolLM2-135M-Instruct.Q4_1.gguf";
constexpr const char* kGolden = DSPARK_SOURCE_DIR "/tests/golden/tokenizer_strings.jsonl";

std::string model_path() {
  std::string home;
  if (const char* h = std::getenv("DSPARK_HOME"); h != nullptr && *h != '\0') {
    home = h;
  } else {
    const char* user_home = std::getenv("HOME");
    home = std::string(user_home != nullptr ? user_home : "") + "/.cache/dspark";
  }
  return home + "/models/" + kModelFile;
}

// The real model's tokenizer, loaded once for the whole binary.
struct Model {
  std::unique_ptr<GGUFFile> file;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<ChatTemplate> chat;
};

const Model* model() {
  static const std::unique_ptr<Model> m = []() -> std::unique_ptr<Model> {
    if (!std::filesystem::exists(model_path())) return nullptr;
    auto m = std::make_unique<Model>();
    m->file = std::make_unique<GGUFFile>(model_path());
    m->tok = std::make_unique<Tokenizer>(Tokenizer::from_gguf(*m->file));
    m->chat = std::make_unique<ChatTemplate>(ChatTemplate::from_gguf(*m->file, *m->tok));
    return m;
  }();
  return m.get();
}

#define REQUIRE_MODEL()                                                                   \
  const Model* M = model();                                                               \
  ASSERT_NE(M, nullptr) << "model file " << model_path()                                  \
                        << " is missing; run `make setup` to fetch it (or set DSPARK_HOME)"

struct Golden {
  json header;
  std::vector<json> encode, chat;
};

const Golden& golden() {
  static const Golden g = [] {
    Golden g;
    std::ifstream in(kGolden);
    if (!in) throw std::runtime_error(std::string("cannot open ") + kGolden);
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      json j = json::parse(line);
      const std::string kind = j.at("kind");
      if (kind == "header") g.header = std::move(j);
      else if (kind == "encode") g.encode.push_back(std::move(j));
      else if (kind == "chat") g.chat.push_back(std::move(j));
    }
    return g;
  }();
  return g;
}

std::string hex(const std::string& s) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

std::string show_ids(const std::vector<TokenId>& ids) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < ids.size(); ++i) os << (i ? ", " : "") << ids[i];
  os << "]";
  return os.str();
}

// Independent UTF-8 check (Unicode Table 3-7, well-formed byte sequences).
// Returns the length of the well-formed sequence at s[i], or 0.
size_t wellformed_len(const std::string& s, size_t i) {
  auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const size_t n = s.size() - i;
  const unsigned char c = b(i);
  auto in = [](unsigned char v, unsigned lo, unsigned hi) { return v >= lo && v <= hi; };
  if (c <= 0x7F) return 1;
  if (in(c, 0xC2, 0xDF)) return n >= 2 && in(b(i + 1), 0x80, 0xBF) ? 2 : 0;
  if (in(c, 0xE0, 0xEF)) {
    const unsigned lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    return n >= 3 && in(b(i + 1), lo, hi) && in(b(i + 2), 0x80, 0xBF) ? 3 : 0;
  }
  if (in(c, 0xF0, 0xF4)) {
    const unsigned lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    return n >= 4 && in(b(i + 1), lo, hi) && in(b(i + 2), 0x80, 0xBF) && in(b(i + 3), 0x80, 0xBF) ? 4 : 0;
  }
  return 0;
}

// Length of the maximal subpart of the ill-formed sequence at s[i]: the
// longest prefix of a well-formed sequence found there, at least one byte.
size_t maximal_subpart(const std::string& s, size_t i) {
  auto b = [&](size_t k) { return static_cast<unsigned>(static_cast<unsigned char>(s[k])); };
  const unsigned c = b(i);
  size_t need = 0;
  unsigned lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) need = 2;
  else if (c >= 0xE0 && c <= 0xEF) need = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
  else if (c >= 0xF0 && c <= 0xF4) need = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
  else return 1;
  size_t k = 1;
  while (k < need && i + k < s.size() && b(i + k) >= (k == 1 ? lo : 0x80) && b(i + k) <= (k == 1 ? hi : 0xBF)) ++k;
  return k;
}

// `s` with each maximal subpart of an ill-formed sequence replaced by U+FFFD.
std::string lossy(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    if (const size_t len = wellformed_len(s, i)) {
      out.append(s, i, len);
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      i += maximal_subpart(s, i);
    }
  }
  return out;
}

bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const size_t len = wellformed_len(s, i);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

// ---------------------------------------------------------------- golden parity

TEST(TokenizerGolden, HeaderMatchesModel) {
  REQUIRE_MODEL();
  const Golden& g = golden();
  EXPECT_EQ(g.header.at("model"), kModelFile);
  EXPECT_EQ(g.header.at("vocab_size").get<int64_t>(), M->tok->vocab_size());
  EXPECT_EQ(g.header.at("tokenizer_pre").get<std::string>(), M->tok->pre_tokenizer_name());
  size_t with_specials = 0;
  for (const auto& c : g.encode) with_specials += c.at("parse_special").get<bool>();
  EXPECT_GE(with_specials, 300u);
  EXPECT_GE(g.chat.size(), 5u);
}

TEST(TokenizerGolden, EncodeMatchesReference) {
  REQUIRE_MODEL();
  size_t failures = 0;
  for (const auto& c : golden().encode) {
    const std::string text = c.at("text");
    const auto expected = c.at("ids").get<std::vector<TokenId>>();
    const auto got = M->tok->encode(text, c.at("parse_special").get<bool>());
    if (got != expected && ++failures <= 20) {
      ADD_FAILURE() << c.at("name").get<std::string>() << " text=" << json(text).dump()
                    << "\n  expected " << show_ids(expected) << "\n  got      " << show_ids(got);
    }
  }
  EXPECT_EQ(failures, 0u) << "of " << golden().encode.size() << " golden strings";
}

TEST(TokenizerGolden, DecodeRoundTrips) {
  REQUIRE_MODEL();
  size_t lossless = 0;
  for (const auto& c : golden().encode) {
    const std::string name = c.at("name");
    const std::string text = c.at("text");
    const auto ids = c.at("ids").get<std::vector<TokenId>>();
    const std::string decoded = M->tok->decode(ids);
    if (c.at("lossless").get<bool>()) {
      ++lossless;
      EXPECT_EQ(decoded, text) << name;
      EXPECT_EQ(M->tok->decode(M->tok->encode(text, c.at("parse_special").get<bool>())), text) << name;
    } else {
      // Bytes without a byte-level symbol in the vocabulary were dropped.
      EXPECT_EQ(hex(decoded), c.at("decoded_hex").get<std::string>()) << name;
    }
  }
  EXPECT_GE(lossless, 300u);
}

TEST(StreamDecoderGolden, ConcatenationEqualsDecode) {
  REQUIRE_MODEL();
  for (const auto& c : golden().encode) {
    const std::string name = c.at("name");
    const auto ids = c.at("ids").get<std::vector<TokenId>>();
    StreamDecoder sd(*M->tok);
    std::string streamed;
    for (TokenId id : ids) {
      const std::string piece = sd.push(id);
      ASSERT_TRUE(valid_utf8(piece)) << name << ": push(" << id << ") gave invalid UTF-8 " << hex(piece);
      streamed += piece;
    }
    const std::string tail = sd.flush();
    ASSERT_TRUE(valid_utf8(tail)) << name;
    streamed += tail;
    const std::string decoded = M->tok->decode(ids);
    // Text with dropped bytes decodes to ill-formed UTF-8, which the stream
    // repairs; everything else must come out unchanged.
    EXPECT_EQ(streamed, valid_utf8(decoded) ? decoded : lossy(decoded)) << name;
    if (c.at("lossless").get<bool>()) {
      EXPECT_EQ(streamed, c.at("text").get<std::string>()) << name;
    }
  }
}

TEST(ChatTemplateGolden, MatchesReferenceRendering) {
  REQUIRE_MODEL();
  for (const auto& c : golden().chat) {
    const std::string name = c.at("name");
    std::vector<ChatMessage> msgs;
    bool literal_specials = false;
    for (const auto& m : c.at("messages")) {
      msgs.push_back({m.at("role").get<std::string>(), m.at("content").get<std::string>()});
      literal_specials |= msgs.back().content.find("<|") != std::string::npos;
    }
    const bool gen = c.at("add_generation_prompt");
    const std::string rendered = c.at("rendered");
    const auto expected = c.at("ids").get<std::vector<TokenId>>();
    EXPECT_EQ(M->chat->render(msgs, gen), rendered) << name;
    EXPECT_EQ(M->chat->apply(msgs, gen), expected) << name;
    if (!literal_specials) {
      EXPECT_EQ(M->tok->encode(rendered, true), expected) << name;
    }
  }
}

// ------------------------------------------------------------- model behaviour

TEST(ChatTemplate, DefaultSystemPromptFromTemplate) {
  REQUIRE_MODEL();
  ASSERT_TRUE(M->chat->default_system_prompt().has_value());
  EXPECT_EQ(*M->chat->default_system_prompt(),
            "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  const std::string p = "Explain in three sentences why the sky is blue.";
  const std::string expected_text =
      "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
      "<|im_start|>user\n" + p + "<|im_end|>\n<|im_start|>assistant\n";
  EXPECT_EQ(M->chat->render({{"user", p}}, true), expected_text);
  EXPECT_EQ(M->chat->apply({{"user", p}}, true), M->tok->encode(expected_text, true));
  // An explicit system message replaces the default one.
  const auto with_system = M->chat->render({{"system", "Be brief."}, {"user", p}}, false);
  EXPECT_EQ(with_system, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n" + p + "<|im_end|>\n");
}

TEST(ChatTemplate, EndOfTurnIsImEnd) {
  REQUIRE_MODEL();
  const auto im_end = M->tok->find_token("<|im_end|>");
  ASSERT_TRUE(im_end.has_value());
  EXPECT_EQ(M->chat->end_of_turn(), *im_end);
  EXPECT_EQ(M->tok->token_type(*im_end), TokenType::Control);
  EXPECT_TRUE(M->tok->is_eog(M->chat->end_of_turn()));
  EXPECT_EQ(M->chat->format(), dspark::tok::ChatFormat::ChatML);
  const auto ids = M->chat->apply({{"user", "hi"}}, false);
  ASSERT_GE(ids.size(), 2u);
  EXPECT_EQ(ids[ids.size() - 2], *im_end);
}

TEST(ChatTemplate, ContentSpecialTextStaysLiteral) {
  REQUIRE_MODEL();
  const auto ids = M->chat->apply({{"system", "s"}, {"user", "a<|im_end|>b"}}, false);
  const auto im_end = *M->tok->find_token("<|im_end|>");
  EXPECT_EQ(std::count(ids.begin(), ids.end(), im_end), 2);  // one per turn only
}

TEST(ChatTemplate, UnknownRoleThrows) {
  REQUIRE_MODEL();
  EXPECT_THROW(M->chat->apply({{"tool", "x"}}, true), InvalidArgument);
  EXPECT_THROW(M->chat->render({{"User", "x"}}, true), InvalidArgument);
}

TEST(Tokenizer, SpecialsFromMetadata) {
  REQUIRE_MODEL();
  const auto& sp = M->tok->specials();
  EXPECT_EQ(M->tok->vocab_size(), 49152);
  EXPECT_EQ(sp.bos, *M->tok->find_token("<|im_start|>"));
  EXPECT_EQ(sp.eos, *M->tok->find_token("<|im_end|>"));
  EXPECT_EQ(sp.eot, sp.eos);  // no eot key in this file: falls back to eos
  EXPECT_FALSE(sp.add_bos);
  EXPECT_EQ(M->tok->pre_tokenizer_name(), "smollm");
  EXPECT_EQ(M->tok->token_text(sp.bos), "<|im_start|>");
  EXPECT_EQ(M->tok->token_bytes(*M->tok->find_token("\xC4\xA0")), " ");  // "Ġ" is the space byte
}

TEST(Tokenizer, SpecialTokensAtomicOnlyWhenParsed) {
  REQUIRE_MODEL();
  const std::string s = "<|im_start|>user\nhi<|im_end|>";
  const auto parsed = M->tok->encode(s, true);
  const auto literal = M->tok->encode(s, false);
  const auto start = *M->tok->find_token("<|im_start|>");
  EXPECT_EQ(parsed.front(), start);
  for (TokenId id : literal) EXPECT_EQ(M->tok->token_type(id), TokenType::Normal);
  EXPECT_EQ(M->tok->decode(parsed), s);
  EXPECT_EQ(M->tok->decode(literal), s);
}

TEST(Tokenizer, InvalidIdsThrow) {
  REQUIRE_MODEL();
  EXPECT_THROW(M->tok->decode({0, -1}), InvalidArgument);
  EXPECT_THROW(M->tok->token_bytes(static_cast<TokenId>(M->tok->vocab_size())), InvalidArgument);
  EXPECT_THROW(M->tok->token_text(-5), InvalidArgument);
  EXPECT_THROW(M->tok->token_type(1 << 30), InvalidArgument);
  EXPECT_FALSE(M->tok->is_eog(-1));
  StreamDecoder sd(*M->tok);
  EXPECT_THROW(sd.push(-1), InvalidArgument);
}

TEST(Tokenizer, InvalidUtf8InputIsEncodedBytewise) {
  REQUIRE_MODEL();
  const std::string s = "ab\x80 cd\xC3 \xE2\x82 x\xED\xA0\x80y\xC3";
  std::vector<TokenId> ids;
  ASSERT_NO_THROW(ids = M->tok->encode(s, true));
  EXPECT_EQ(M->tok->decode(ids), s);
}

TEST(Tokenizer, LongInputs) {
  REQUIRE_MODEL();
  const std::vector<std::string> inputs = {
      std::string(100000, ' '), std::string(100000, 'a'), std::string(50000, '7'),
      std::string(20000, '\n') + "x", [] {
        std::string s;
        for (int i = 0; i < 5000; ++i) s += "word" + std::to_string(i) + " \t\n";
        return s;
      }()};
  for (const auto& s : inputs) {
    const auto ids = M->tok->encode(s, true);
    EXPECT_EQ(M->tok->decode(ids), s);
  }
}

TEST(Tokenizer, ConcurrentEncodeIsConsistent) {
  REQUIRE_MODEL();
  const auto& cases = golden().encode;
  std::vector<std::thread> threads;
  std::vector<size_t> mismatches(4, 0);
  for (size_t t = 0; t < mismatches.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 3; ++rep) {
        for (const auto& c : cases) {
          const auto got = M->tok->encode(c.at("text").get<std::string>(), c.at("parse_special").get<bool>());
          if (got != c.at("ids").get<std::vector<TokenId>>()) ++mismatches[t];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (size_t m : mismatches) EXPECT_EQ(m, 0u);
}

TEST(TokenizerPerf, EncodeSpeed) {
  REQUIRE_MODEL();
  std::string text;
  for (const auto& c : golden().encode) {
    const std::string name = c.at("name");
    if (name.rfind("prose", 0) == 0 || name.rfind("code", 0) == 0 || name.rfind("long", 0) == 0) {
      text += c.at("text").get<std::string>();
      text += "\n";
    }
  }
  text = text.substr(0, 8192);
  size_t tokens = 0;
  const auto t0 = std::chrono::steady_clock::now();
  const std::clock_t c0 = std::clock();
  int reps = 0;
  double secs = 0;
  do {
    tokens += M->tok->encode(text, true).size();
    ++reps;
    secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (secs < 0.5);
  // CPU time is steadier than wall time on a busy machine.
  const double cpu = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
  const double tps = static_cast<double>(tokens) / (cpu > 0 ? cpu : secs);
  std::printf("[ perf     ] encode: %zu bytes x %d reps, %.2fM tokens/s, %.1f MB/s (CPU time; wall %.2fM tokens/s)\n",
              text.size(), reps, tps / 1e6, static_cast<double>(text.size()) * reps / (cpu > 0 ? cpu : secs) / 1e6,
              static_cast<double>(tokens) / secs / 1e6);
  RecordProperty("encode_tokens_per_second", static_cast<int>(tps));
  EXPECT_GT(tokens, 0u);
}

// ------------------------------------------------------- stream decoder basics

TEST(StreamDecoder, HoldsPartialSequences) {
  REQUIRE_MODEL();
  const Tokenizer& tok = *M->tok;
  // One token per byte of U+1F600 (F0 9F 98 80), via the byte-symbol tokens.
  auto byte_token = [&](unsigned char b) {
    for (TokenId id = 0; id < tok.vocab_size(); ++id) {
      if (tok.token_type(id) == TokenType::Normal && tok.token_bytes(id) == std::string(1, static_cast<char>(b)))
        return id;
    }
    throw std::runtime_error("no byte token");
  };
  StreamDecoder sd(tok);
  EXPECT_EQ(sd.push(byte_token('a')), "a");
  EXPECT_EQ(sd.push(byte_token(0xF0)), "");
  EXPECT_EQ(sd.push(byte_token(0x9F)), "");
  EXPECT_EQ(sd.push(byte_token(0x98)), "");
  EXPECT_EQ(sd.push(byte_token(0x80)), "\xF0\x9F\x98\x80");
  // A continuation byte with no lead byte can never become valid.
  EXPECT_EQ(sd.push(byte_token(0x80)), "\xEF\xBF\xBD");
  // A lead byte followed by ASCII: the lead byte alone is replaced.
  EXPECT_EQ(sd.push(byte_token(0xE2)), "");
  EXPECT_EQ(sd.push(byte_token('b')), "\xEF\xBF\xBD" "b");
  // An unfinished sequence is held until flush.
  EXPECT_EQ(sd.push(byte_token(0xE2)), "");
  EXPECT_EQ(sd.push(byte_token(0x82)), "");
  EXPECT_EQ(sd.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(sd.flush(), "");
  // The end of a generation: finish() drops the unfinished sequence instead,
  // and the decoder starts afresh.
  EXPECT_EQ(sd.push(byte_token('a')), "a");
  EXPECT_EQ(sd.push(byte_token(0xE3)), "");
  EXPECT_EQ(sd.push(byte_token(0x81)), "");
  sd.finish();
  EXPECT_EQ(sd.flush(), "");
  EXPECT_EQ(sd.push(byte_token(0x82)), "\xEF\xBF\xBD");  // a stray continuation byte, not the rest of it
}

// ------------------------------------------------------------ synthetic GGUFs

// Writes a GGUF v3 file with only metadata.
class GgufWriter {
 public:
  void str(const std::string& key, const std::string& v) {
    kv_key(key, 8);
    put_str(v);
  }
  void u32(const std::string& key, uint32_t v) {
    kv_key(key, 4);
    put(v);
  }
  void boolean(const std::string& key, bool v) {
    kv_key(key, 7);
    body_.push_back(v ? 1 : 0);
  }
  void str_array(const std::string& key, const std::vector<std::string>& v) {
    kv_key(key, 9);
    put(uint32_t{8});
    put(uint64_t{v.size()});
    for (const auto& s : v) put_str(s);
  }
  void i32_array(const std::string& key, const std::vector<int32_t>& v) {
    kv_key(key, 9);
    put(uint32_t{5});
    put(uint64_t{v.size()});
    for (int32_t x : v) put(x);
  }
  std::string write(const std::string& name) const {
    const auto path = (std::filesystem::temp_directory_path() /
                       ("dspark_tok_" + std::to_string(::getpid()) + "_" + name + ".gguf")).string();
    std::string out = "GGUF";
    auto raw = [&](auto v) { out.append(reinterpret_cast<const char*>(&v), sizeof v); };
    raw(uint32_t{3});
    raw(uint64_t{0});
    raw(uint64_t{n_});
    out += body_;
    out.resize((out.size() + 31) / 32 * 32, '\0');
    std::ofstream(path, std::ios::binary) << out;
    return path;
  }

 private:
  template <typename T>
  void put(T v) {
    body_.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  void put_str(const std::string& s) {
    put(uint64_t{s.size()});
    body_ += s;
  }
  void kv_key(const std::string& key, uint32_t type) {
    put_str(key);
    put(type);
    ++n_;
  }
  std::string body_;
  uint64_t n_ = 0;
};

// A byte-level vocabulary: the 256 byte symbols (ids 0..255 in byte order),
// then the given extra tokens.
std::vector<std::string> byte_vocab(const std::vector<std::string>& extra) {
  std::vector<std::string> v;
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    const int cp = printable ? b : next++;
    std::string s;
    if (cp < 0x80) {
      s.push_back(static_cast<char>(cp));
    } else {
      s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
    v.push_back(s);
  }
  v.insert(v.end(), extra.begin(), extra.end());
  return v;
}

struct Synthetic {
  std::vector<std::string> tokens;
  std::vector<std::string> merges;
  std::vector<int32_t> types;  // empty: no token_type key
  std::string model = "gpt2";
  std::string pre = "gpt2";
  std::string chat_template;

  std::string write(const std::string& name) const {
    GgufWriter w;
    w.str("general.architecture", "llama");
    w.str("tokenizer.ggml.model", model);
    if (!pre.empty()) w.str("tokenizer.ggml.pre", pre);
    w.str_array("tokenizer.ggml.tokens", tokens);
    if (!types.empty()) w.i32_array("tokenizer.ggml.token_type", types);
    w.str_array("tokenizer.ggml.merges", merges);
    w.u32("tokenizer.ggml.eos_token_id", 0);
    w.boolean("tokenizer.ggml.add_bos_token", false);
    if (!chat_template.empty()) w.str("tokenizer.chat_template", chat_template);
    return w.write(name);
  }
};

Tokenizer load(const Synthetic& s, const std::string& name) {
  const std::string path = s.write(name);
  GGUFFile f(path);
  std::filesystem::remove(path);
  return Tokenizer::from_gguf(f);
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const FormatError& e) {
    return e.what();
  }
  return "(no FormatError)";
}

TEST(TokenizerMerges, LowestRankThenLeftmost) {
  Synthetic s;
  // ids: 256 "aa", 257 "ab", 258 "aab", 259 "aaa"
  s.tokens = byte_vocab({"aa", "ab", "aab", "aaa"});
  s.merges = {"a b", "a a", "aa b", "aa a"};
  const Tokenizer tok = load(s, "merges");
  // "aab": (a,b) has rank 0 and wins over the leftmost (a,a) of rank 1.
  EXPECT_EQ(tok.encode("aab", false), (std::vector<TokenId>{'a', 257}));
  // "aaa": equal ranks, the leftmost pair merges first, then (aa,a).
  EXPECT_EQ(tok.encode("aaa", false), (std::vector<TokenId>{259}));
  // "aaaa": leftmost (a,a) twice, nothing joins aa+aa.
  EXPECT_EQ(tok.encode("aaaa", false), (std::vector<TokenId>{256, 256}));
  EXPECT_EQ(tok.encode("aaaaa", false), (std::vector<TokenId>{256, 259}));
  // The space starts a new pre-token: " aab" -> " a" is not a token.
  EXPECT_EQ(tok.encode("x aab", false), (std::vector<TokenId>{'x', ' ', 'a', 257}));
}

TEST(TokenizerMerges, PreTokenizerNames) {
  Synthetic s;
  s.tokens = byte_vocab({});
  for (const char* ok : {"gpt2", "default", "smollm", "llama3", "llama-bpe", "starcoder", "qwen2", "deepseek-r1-qwen"}) {
    s.pre = ok;
    const Tokenizer tok = load(s, std::string("pre_") + ok);
    const std::string text = "Hello  world 12345 it's\n\n";
    EXPECT_EQ(tok.decode(tok.encode(text, true)), text) << ok;
  }
  s.pre = "";  // key absent: default
  EXPECT_EQ(load(s, "pre_absent").pre_tokenizer_name(), "default");
  s.pre = "no-such-pre";
  const std::string err = error_of([&] { load(s, "pre_bad"); });
  EXPECT_NE(err.find("unsupported tokenizer.ggml.pre 'no-such-pre'"), std::string::npos) << err;
  EXPECT_NE(err.find("qwen2"), std::string::npos) << "the message lists the supported names: " << err;
  s.pre = "qwen35";  // a later Qwen pattern (letters with combining marks): not the same, refused
  EXPECT_NE(error_of([&] { load(s, "pre_qwen35"); }).find("'qwen35'"), std::string::npos);
}

// User-defined tokens (Qwen3's <think>) match whether or not special tokens are
// parsed; control tokens only when they are (llama.cpp and HF tokenizers alike).
TEST(TokenizerMerges, UserDefinedTokensAlwaysMatch) {
  Synthetic s;
  s.tokens = byte_vocab({"<think>", "<|im_start|>"});
  s.types.assign(s.tokens.size(), 1);
  s.types[256] = 4;
  s.types[257] = 3;
  const Tokenizer tok = load(s, "user_defined");
  const std::string text = "a<think><|im_start|>";
  EXPECT_EQ(tok.encode(text, true), (std::vector<TokenId>{'a', 256, 257}));
  std::vector<TokenId> literal = {'a', 256};
  for (char c : std::string("<|im_start|>")) literal.push_back(static_cast<unsigned char>(c));
  EXPECT_EQ(tok.encode(text, false), literal);
}

// Llama 3 groups up to three digits; Qwen2 splits every digit, otherwise the same.
TEST(TokenizerMerges, DigitsSplitIndividuallyForQwen2) {
  Synthetic s;
  s.tokens = byte_vocab({"12", "45", "\xC4\xA0" "it"});  // "Ġit" (Ġ is the space byte)
  s.merges = {"1 2", "4 5", "i t", "\xC4\xA0 it"};
  s.tokens.push_back("it");
  s.pre = "llama3";
  EXPECT_EQ(load(s, "dig_llama3").encode("12345", false), (std::vector<TokenId>{256, '3', 257}));
  s.pre = "qwen2";
  const Tokenizer qwen = load(s, "dig_qwen2");
  EXPECT_EQ(qwen.encode("12345", false), (std::vector<TokenId>{'1', '2', '3', '4', '5'}));
  // Letters take one leading non-letter; contractions are case-insensitive.
  EXPECT_EQ(qwen.encode(" it'S", false), (std::vector<TokenId>{258, '\'', 'S'}));
}

TEST(TokenizerMerges, DigitsSplitIndividuallyOnlyForSmollm) {
  Synthetic s;
  s.tokens = byte_vocab({"12", "\xC4\xA0" "1"});  // "12", "Ġ1" (Ġ is the space byte)
  s.merges = {"\xC4\xA0 1", "1 2"};
  s.pre = "gpt2";
  EXPECT_EQ(load(s, "dig_gpt2").encode(" 12", false), (std::vector<TokenId>{257, '2'}));
  s.pre = "smollm";
  const Tokenizer smol = load(s, "dig_smollm");
  // A space before a digit stays alone; digits never merge with each other.
  EXPECT_EQ(smol.encode(" 12", false), (std::vector<TokenId>{' ', '1', '2'}));
}

TEST(TokenizerErrors, RejectsBadMetadata) {
  Synthetic s;
  s.tokens = byte_vocab({"ab"});
  s.merges = {"a b"};

  Synthetic m = s;
  m.model = "rwkv";  // a tokenizer kind we do not implement
  const std::string bad_model = error_of([&] { load(m, "bad_model"); });
  EXPECT_NE(bad_model.find("'rwkv'"), std::string::npos) << bad_model;
  EXPECT_NE(bad_model.find("supported: 'gpt2'"), std::string::npos) << bad_model;

  Synthetic t = s;
  t.types = {1, 1, 1};
  EXPECT_NE(error_of([&] { load(t, "bad_types"); }).find("token_type"), std::string::npos);

  Synthetic mg = s;
  mg.merges = {"a b", "a c"};  // "ac" is not in the vocabulary
  EXPECT_NE(error_of([&] { load(mg, "bad_merge"); }).find("merges[1]"), std::string::npos);

  Synthetic ok = s;
  EXPECT_NO_THROW(load(ok, "good"));
}

TEST(ChatTemplateErrors, RequiresChatMLTemplate) {
  Synthetic s;
  s.tokens = byte_vocab({"<|im_start|>", "<|im_end|>"});
  s.types.assign(s.tokens.size(), 1);
  s.types[256] = s.types[257] = 3;

  auto make = [&](const Synthetic& syn, const std::string& name) {
    const std::string path = syn.write(name);
    GGUFFile f(path);
    std::filesystem::remove(path);
    const Tokenizer tok = Tokenizer::from_gguf(f);
    return ChatTemplate::from_gguf(f, tok).format();
  };
  EXPECT_NE(error_of([&] { make(s, "chat_absent"); }).find("tokenizer.chat_template"), std::string::npos);
  Synthetic llama = s;
  llama.chat_template = "{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}";
  EXPECT_NE(error_of([&] { make(llama, "chat_llama"); }).find("[INST]"), std::string::npos);

  Synthetic chatml = s;
  chatml.chat_template =
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
      "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
  const std::string path = chatml.write("chat_ok");
  GGUFFile f(path);
  std::filesystem::remove(path);
  const Tokenizer tok = Tokenizer::from_gguf(f);
  const ChatTemplate ct = ChatTemplate::from_gguf(f, tok);
  EXPECT_FALSE(ct.default_system_prompt().has_value());
  EXPECT_EQ(ct.end_of_turn(), 257);
  EXPECT_EQ(ct.render({{"user", "hi"}}, true), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(ct.apply({{"user", "hi"}}, true), tok.encode(ct.render({{"user", "hi"}}, true), true));
}

}  // namespace
