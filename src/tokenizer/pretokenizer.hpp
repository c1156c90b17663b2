// Regex pre-tokenizers for byte-level BPE, selected by `tokenizer.ggml.pre`.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace dspark::tok::detail {

/// Splits text into pre-tokens (the units BPE runs on) with a chain of PCRE2
/// regexes compiled in UTF + UCP mode. Each stage splits every piece produced
/// by the previous stage on its own: matches and the text between matches both
/// become pieces, and a piece is matched as a separate subject, so a lookahead
/// never sees past the end of its piece. Immutable and safe to share between
/// threads.
class PreTokenizer {
 public:
  /// The pre-tokenizer llama.cpp and Hugging Face define for `name`:
  ///   "smollm", "starcoder", "refact": every numeric character on its own
  ///       (Hugging Face Digits(individual_digits)), then the GPT-2 pattern;
  ///   "gpt2", "gpt-2", "default": the GPT-2 pattern;
  ///   "llama3", "llama-bpe": the Llama 3 pattern (numbers in groups of up
  ///       to three digits);
  ///   "qwen2", "deepseek-r1-qwen": the Qwen2 pattern (Qwen2, Qwen2.5, Qwen3):
  ///       the Llama 3 pattern with every numeric character on its own.
  /// Hugging Face's NFC normalizer of the Qwen tokenizers is not applied (as
  /// in llama.cpp): text not in NFC may tokenize differently from HF.
  /// Throws dspark::FormatError naming `name` when it is not one of these, or
  /// when PCRE2 rejects a pattern.
  static PreTokenizer for_name(const std::string& name);

  /// The patterns of the stages, in order (for diagnostics).
  std::vector<std::string> patterns() const;

  /// Appends the pieces of `text` to `out` as views into `text`, in order;
  /// their concatenation is `text`. Bytes that are not valid UTF-8 never match
  /// and end up in the pieces between matches. Throws dspark::Error if PCRE2
  /// reports a matching error (e.g. a resource limit).
  void split(std::string_view text, std::vector<std::string_view>& out) const;

  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;
  ~PreTokenizer();

 private:
  struct Stage;
  PreTokenizer();
  std::vector<std::unique_ptr<Stage>> stages_;
};

}  // namespace dspark::tok::detail
