// SentencePiece-style tokenization from GGUF metadata (tokenizer.ggml.model =
// "llama": Llama 1/2, Gemma), as llama.cpp's llm_tokenizer_spm does it.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace dspark::tok::detail {

/// Merging by vocabulary scores. The text (spaces already written as U+2581
/// "▁") starts as one symbol per UTF-8 character; repeatedly the adjacent pair
/// whose concatenation is a vocabulary entry with the highest score merges
/// (ties: the leftmost pair), until no pair is an entry. A final symbol that
/// is not an entry becomes its bytes, each as its byte-fallback token
/// `<0xXX>` (or, lacking that, the unknown token).
class SpmModel {
 public:
  /// index: vocabulary text -> id (the later id for duplicates); scores: [V];
  /// byte_id: id of each byte's <0xXX> token, -1 when absent; unk: -1 if none.
  SpmModel(const std::unordered_map<std::string_view, int32_t>& index, std::vector<float> scores,
           std::array<int32_t, 256> byte_id, int32_t unk)
      : index_(&index), scores_(std::move(scores)), byte_id_(byte_id), unk_(unk) {}

  /// Appends the ids of `text` (already escaped) to `out`.
  void encode(std::string_view text, std::vector<int32_t>& out) const;

 private:
  const std::unordered_map<std::string_view, int32_t>* index_;
  std::vector<float> scores_;
  std::array<int32_t, 256> byte_id_;
  int32_t unk_;
};

/// Text with every ' ' replaced by "▁" (U+2581), as SentencePiece escapes
/// whitespace; `prefix_space` first adds one leading space.
std::string spm_escape(std::string_view text, bool prefix_space);

/// A piece of input text before model tokenization: either raw text or one
/// special token matched literally.
struct Fragment {
  std::string_view text;  // raw text (empty for a token)
  int32_t token = -1;     // >= 0: a matched special token
};

/// A special token that input text can spell: control or user-defined.
struct SpecialText {
  std::string_view text;
  int32_t id;
  bool control;  // matched only when special-token parsing is on
};

/// Splits `text` at literal occurrences of special tokens the way llama.cpp
/// does: the tokens in the given order (longest first), each splitting every
/// raw fragment at all its non-overlapping occurrences, leftmost first.
/// User-defined tokens always split; control tokens only with `parse_special`.
std::vector<Fragment> partition_special(std::string_view text, const std::vector<SpecialText>& specials,
                                        bool parse_special);

}  // namespace dspark::tok::detail
