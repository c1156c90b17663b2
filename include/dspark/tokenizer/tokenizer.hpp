// dspark/tokenizer/tokenizer.hpp — GPT-2-style byte-level BPE tokenizer built
// from a GGUF file's `tokenizer.ggml.*` metadata.
//
// Source formats: GGUF tokenizer keys (ggml docs/gguf.md: tokenizer.ggml.model,
// .pre, .tokens, .token_type, .merges, .bos_token_id, .eos_token_id,
// .eot_token_id, .padding_token_id, .unknown_token_id, .add_bos_token), the
// GPT-2 byte-to-unicode mapping, and the pre-tokenizer regexes of the model
// families that llama.cpp names in `tokenizer.ggml.pre` (PCRE2, UTF mode).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dspark/io/gguf.hpp"

namespace dspark::tok {

using TokenId = int32_t;

/// Token types as stored in tokenizer.ggml.token_type.
enum class TokenType : int32_t {
  Undefined = 0, Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6,
};

/// Special token ids read from the GGUF; -1 when the file does not declare one.
struct SpecialIds {
  TokenId bos = -1;
  TokenId eos = -1;
  TokenId eot = -1;   // end of turn (tokenizer.ggml.eot_token_id), falls back to eos
  TokenId pad = -1;
  TokenId unk = -1;
  bool add_bos = false;
};

/// Byte-level BPE tokenizer. Immutable after construction; thread-safe to use.
class Tokenizer {
 public:
  /// Builds from the GGUF metadata. Throws dspark::FormatError when the
  /// tokenizer model is not "gpt2" (byte-level BPE), the pre-tokenizer name is
  /// unknown, or the token/merge arrays are inconsistent.
  static Tokenizer from_gguf(const io::GGUFFile& file);

  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  /// Encodes UTF-8 `text` to ids. With `parse_special` true, control and
  /// user-defined tokens (e.g. "<|im_start|>") that appear literally in the
  /// text are matched atomically; with false they are tokenized as plain text.
  /// Never adds BOS (see add_bos in specials()).
  std::vector<TokenId> encode(std::string_view text, bool parse_special) const;

  /// Concatenated bytes of `ids` (special tokens render as their text).
  std::string decode(const std::vector<TokenId>& ids) const;

  /// Raw bytes of one token (after undoing the GPT-2 byte mapping).
  /// Throws dspark::InvalidArgument for an id outside [0, vocab_size()).
  const std::string& token_bytes(TokenId id) const;

  /// The token's string as stored in the vocabulary (byte-mapped form).
  const std::string& token_text(TokenId id) const;

  int64_t vocab_size() const;
  const SpecialIds& specials() const;
  TokenType token_type(TokenId id) const;
  /// True for end-of-generation ids: eos and eot.
  bool is_eog(TokenId id) const;
  /// Looks up an exact vocabulary entry (e.g. "<|im_end|>").
  std::optional<TokenId> find_token(std::string_view text) const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Incremental detokenizer for streaming: push() returns only complete UTF-8
/// sequences and holds back a trailing partial one until later bytes arrive.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer) : tok_(&tokenizer) {}
  /// Appends one token; returns the text that is now complete (may be empty).
  std::string push(TokenId id);
  /// Returns whatever is held back (invalid trailing bytes become U+FFFD).
  std::string flush();

 private:
  const Tokenizer* tok_;
  std::string pending_;
};

}  // namespace dspark::tok
