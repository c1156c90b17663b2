#include "pretokenizer.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <utility>

#include "dspark/error.hpp"

namespace dspark::tok::detail {

namespace {

// Unicode White_Space, spelled out: the reference implementation's regex engine
// (Oniguruma) uses this set for \s, and it includes U+0085, which PCRE2's \s
// does not.
#define DSPARK_WS "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"

// GPT-2: English contractions, letter runs, number runs, other-symbol runs (each
// optionally led by one space), whitespace not followed by a non-space, and any
// remaining whitespace.
constexpr const char* kGpt2 =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" DSPARK_WS "\\p{L}\\p{N}]+"
    "|[" DSPARK_WS "]+(?![^" DSPARK_WS "])|[" DSPARK_WS "]+";

// Llama 3: case-insensitive contractions, letters led by one non-letter, numbers
// (NUMBERS: a pattern for one number piece), symbols with trailing newlines,
// newline runs.
#define DSPARK_LLAMA3_STYLE(NUMBERS)                                                  \
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|" NUMBERS               \
  "| ?[^" DSPARK_WS "\\p{L}\\p{N}]+[\\r\\n]*|[" DSPARK_WS "]*[\\r\\n]+"               \
  "|[" DSPARK_WS "]+(?![^" DSPARK_WS "])|[" DSPARK_WS "]+"

// Llama 3: numbers in groups of up to three digits.
constexpr const char* kLlama3 = DSPARK_LLAMA3_STYLE("\\p{N}{1,3}");

// Qwen2 (also Qwen2.5 and Qwen3): the Llama 3 pattern with every numeric
// character a piece of its own.
constexpr const char* kQwen2 = DSPARK_LLAMA3_STYLE("\\p{N}");

#undef DSPARK_LLAMA3_STYLE

// One numeric character. Hugging Face's Digits pre-tokenizer tests Rust's
// char::is_numeric (Unicode 15 in the reference build), which also covers the
// Kawi, Kaktovik and Nag Mundari digits that Unicode 15 added.
constexpr const char* kDigit =
    "[\\p{N}\\x{11F50}-\\x{11F59}\\x{1D2C0}-\\x{1D2D3}\\x{1E4F0}-\\x{1E4F9}]";

#undef DSPARK_WS

}  // namespace

struct PreTokenizer::Stage {
  std::string pattern;
  pcre2_code* code = nullptr;

  explicit Stage(std::string pat) : pattern(std::move(pat)) {
    int err = 0;
    PCRE2_SIZE err_off = 0;
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                         PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &err_off, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw FormatError("pre-tokenizer regex does not compile at offset " + std::to_string(err_off) +
                        ": " + reinterpret_cast<const char*>(msg));
    }
    // JIT is an optimisation only; pcre2_match falls back to the interpreter.
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  }
  ~Stage() { pcre2_code_free(code); }
  Stage(const Stage&) = delete;
  Stage& operator=(const Stage&) = delete;
};

PreTokenizer::PreTokenizer() = default;
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;
PreTokenizer::~PreTokenizer() = default;

PreTokenizer PreTokenizer::for_name(const std::string& name) {
  PreTokenizer p;
  if (name == "smollm" || name == "starcoder" || name == "refact") {
    p.stages_.push_back(std::make_unique<Stage>(kDigit));
    p.stages_.push_back(std::make_unique<Stage>(kGpt2));
  } else if (name == "gpt2" || name == "gpt-2" || name == "default") {
    p.stages_.push_back(std::make_unique<Stage>(kGpt2));
  } else if (name == "llama3" || name == "llama-bpe") {
    p.stages_.push_back(std::make_unique<Stage>(kLlama3));
  } else if (name == "qwen2" || name == "deepseek-r1-qwen") {
    p.stages_.push_back(std::make_unique<Stage>(kQwen2));
  } else {
    throw FormatError("unsupported tokenizer.ggml.pre '" + name +
                      "' (supported: smollm, starcoder, refact, gpt2, gpt-2, default, llama3, llama-bpe, "
                      "qwen2, deepseek-r1-qwen)");
  }
  return p;
}

std::vector<std::string> PreTokenizer::patterns() const {
  std::vector<std::string> out;
  for (const auto& s : stages_) out.push_back(s->pattern);
  return out;
}

namespace {

struct MatchData {
  pcre2_match_data* md;
  explicit MatchData(const pcre2_code* code) : md(pcre2_match_data_create_from_pattern(code, nullptr)) {
    if (md == nullptr) throw std::bad_alloc();
  }
  ~MatchData() { pcre2_match_data_free(md); }
  MatchData(const MatchData&) = delete;
  MatchData& operator=(const MatchData&) = delete;
};

// Splits `piece` with `code`, appending matches and the gaps between them.
void split_one(const pcre2_code* code, pcre2_match_data* md, std::string_view piece,
               std::vector<std::string_view>& out) {
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
  const size_t n = piece.size();
  size_t pos = 0;       // where the next search starts
  size_t emitted = 0;   // end of the text already appended to `out`
  while (pos < n) {
    const int rc = pcre2_match(code, subject, n, pos, 0, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      throw Error(std::string("pre-tokenizer regex failed: ") + reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t start = ov[0], end = ov[1];
    if (end == start) {  // cannot happen with the built-in patterns; skip one byte
      pos = start + 1;
      continue;
    }
    if (start > emitted) out.push_back(piece.substr(emitted, start - emitted));
    out.push_back(piece.substr(start, end - start));
    emitted = pos = end;
  }
  if (emitted < n) out.push_back(piece.substr(emitted));
}

}  // namespace

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>& out) const {
  if (text.empty()) return;
  if (stages_.empty()) {
    out.push_back(text);
    return;
  }
  std::vector<std::string_view> cur{text}, next;
  for (size_t s = 0; s < stages_.size(); ++s) {
    const bool last = s + 1 == stages_.size();
    std::vector<std::string_view>& dst = last ? out : next;
    MatchData md(stages_[s]->code);
    for (std::string_view piece : cur) split_one(stages_[s]->code, md.md, piece, dst);
    if (!last) {
      cur.swap(next);
      next.clear();
    }
  }
}

}  // namespace dspark::tok::detail
