// dspark/tokenizer/tokenizer.hpp — tokenizers built from a GGUF file's
// `tokenizer.ggml.*` metadata: GPT-2-style byte-level BPE (model "gpt2") and
// SentencePiece-style merging by scores with byte fallback (model "llama":
// Llama 1/2, Gemma).
//
// Source formats: GGUF tokenizer keys (ggml docs/gguf.md: tokenizer.ggml.model,
// .pre, .tokens, .token_type, .merges, .scores, .bos_token_id, .eos_token_id,
// .eot_token_id, .padding_token_id, .unknown_token_id, .add_bos_token,
// .add_space_prefix), the GPT-2 byte-to-unicode mapping, the pre-tokenizer
// regexes of the model families that llama.cpp names in `tokenizer.ggml.pre`
// (PCRE2, UTF mode), and llama.cpp's llm_tokenizer_spm.
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

/// A tokenizer. Immutable after construction; thread-safe to use.
///
/// Byte-level BPE ("gpt2"). Encoding: optional special-token matching (see encode), then the
/// pre-tokenizer named by `tokenizer.ggml.pre` splits the text into pieces, each
/// piece's bytes become byte symbols (GPT-2 byte-to-unicode mapping) and the
/// ranked merges (`tokenizer.ggml.merges`, lowest rank first, leftmost first on
/// ties) join adjacent symbols until no listed pair remains. This reproduces
/// the Hugging Face `tokenizers` BPE model without unk token or byte fallback:
/// a byte whose symbol is not in the vocabulary (SmolLM2 lacks 21 of the 256,
/// e.g. 0x04 and the lead byte 0xF1) is dropped, so such text does not
/// round-trip.
///
/// SentencePiece ("llama"), as llama.cpp tokenizes it: the text is split at
/// literal special tokens — the longest token first, each at all its
/// occurrences (user-defined tokens such as Gemma's "\n\n" or "<h1>" always;
/// control tokens only when parse_special) — then each run of text has its
/// spaces written as "▁" (with one leading "▁" at the start and after a special
/// token when tokenizer.ggml.add_space_prefix, default true; Gemma: false)
/// and merges by score (see detail::SpmModel); characters no merge covers
/// become byte-fallback tokens <0xXX>. Decoding writes "▁" as a space and
/// byte tokens as their byte.
class Tokenizer {
 public:
  /// Builds from the GGUF metadata. Throws dspark::FormatError when the
  /// tokenizer model is neither "gpt2" nor "llama", the pre-tokenizer name is
  /// unknown (gpt2), or the token/merge/score arrays are inconsistent
  /// (token_type or scores length differs from tokens, a merge whose parts or
  /// result are not in the vocabulary, a special id outside the vocabulary).
  static Tokenizer from_gguf(const io::GGUFFile& file);

  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  /// Encodes UTF-8 `text` to ids. Control tokens (e.g. "<|im_start|>") that
  /// appear literally in the text are matched atomically when `parse_special`
  /// and tokenized as plain text otherwise; user-defined tokens (Qwen3's
  /// "<think>", Gemma's "\n\n") are matched either way, as llama.cpp does
  /// (BPE: leftmost, then longest match; SPM: see the class comment). The
  /// text between matches is encoded on its own. Never adds BOS (see add_bos in specials()). Bytes that are
  /// not valid UTF-8 are accepted and encoded byte by byte. Throws
  /// dspark::Error only if the regex engine hits a resource limit.
  std::vector<TokenId> encode(std::string_view text, bool parse_special) const;

  /// Concatenated bytes of `ids` (special tokens render as their text). The
  /// result may end inside a UTF-8 sequence. Throws dspark::InvalidArgument
  /// for an id outside [0, vocab_size()).
  std::string decode(const std::vector<TokenId>& ids) const;

  /// Raw bytes of one token (after undoing the GPT-2 byte mapping or the
  /// SentencePiece "▁"; control and user-defined tokens give their text). Throws dspark::InvalidArgument for
  /// an id outside [0, vocab_size()).
  const std::string& token_bytes(TokenId id) const;

  /// The token's string as stored in the vocabulary (byte-mapped form).
  /// Throws dspark::InvalidArgument for an id outside [0, vocab_size()).
  const std::string& token_text(TokenId id) const;

  /// Number of vocabulary entries (tokenizer.ggml.tokens).
  int64_t vocab_size() const;
  /// Special ids declared by the file (see SpecialIds).
  const SpecialIds& specials() const;
  /// Type of a token; Normal when the file has no token_type array. Throws
  /// dspark::InvalidArgument for an id outside [0, vocab_size()).
  TokenType token_type(TokenId id) const;
  /// True for end-of-generation ids: eos and eot. False for any other value,
  /// including ids outside the vocabulary.
  bool is_eog(TokenId id) const;
  /// Looks up an exact vocabulary entry (e.g. "<|im_end|>"); when an entry
  /// occurs twice the later id wins. Returns std::nullopt when absent.
  std::optional<TokenId> find_token(std::string_view text) const;
  /// The `tokenizer.ggml.pre` value in effect ("default" when the key is absent).
  const std::string& pre_tokenizer_name() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Incremental detokenizer for streaming: push() returns only complete UTF-8
/// sequences and holds back a trailing partial one until later bytes arrive.
/// Concatenating every push() result and the final flush() gives decode() of
/// all pushed ids with each ill-formed UTF-8 subsequence replaced by U+FFFD
/// (one per maximal subpart), so every returned string is valid UTF-8.
class StreamDecoder {
 public:
  /// Keeps a pointer to `tokenizer`, which must outlive the decoder.
  explicit StreamDecoder(const Tokenizer& tokenizer) : tok_(&tokenizer) {}
  /// Appends one token; returns the text that is now complete (may be empty).
  /// Bytes that can no longer form a valid sequence come out as U+FFFD.
  /// Throws dspark::InvalidArgument for an id outside the vocabulary.
  std::string push(TokenId id);
  /// Returns whatever is held back (an unfinished sequence becomes U+FFFD)
  /// and resets the decoder.
  std::string flush();
  /// The end of a generation: drops a held-back sequence that is still
  /// unfinished (the token budget or a cancel cut a multi-byte character,
  /// whose bytes could only show as U+FFFD) and resets the decoder. Bytes
  /// that can never complete were already returned as U+FFFD by push().
  void finish();

 private:
  const Tokenizer* tok_;
  std::string pending_;
};

}  // namespace dspark::tok
